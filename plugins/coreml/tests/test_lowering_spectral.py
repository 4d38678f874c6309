"""DFT, STFT and MelWeightMatrix lowerings (lowering/ops/spectral.py) against onnxruntime.

Each case lowers a one-node model to MIL, runs it in edgebuild's MIL interpreter and compares
with onnxruntime on the same inputs; parameters (dft_length, axis, frame_step, ...) are
initializers, as a recipe's fixed inputs fold them.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import check_op, rand

RTOL, ATOL = 1e-4, 1e-4


def scalar(value) -> np.ndarray:
    return np.array(value, dtype=np.int64)

DFT_CASES = {
    "real_axis1": ((2, 8, 3, 1), {}, None, 1),
    "complex_axis2": ((2, 5, 6, 2), {}, None, 2),
    "longer_length_pads": ((1, 6, 4, 1), {}, 9, 1),
    "shorter_length_truncates": ((1, 10, 2, 2), {}, 7, 1),
    "onesided_odd": ((3, 9, 1), {"onesided": 1}, None, 1),
    "inverse_complex": ((1, 8, 3, 2), {"inverse": 1}, None, 1),
    "rank3_negative_axis": ((4, 12, 2), {}, None, -2),
}


@pytest.mark.parametrize("case", sorted(DFT_CASES))
@pytest.mark.parametrize("opset", [17, 20])
def test_dft(case, opset):
    shape, attrs, length, axis = DFT_CASES[case]
    inputs = {"x": rand(*shape, seed=11), "dft_length": scalar(length) if length else None}
    if opset >= 20:
        inputs["axis"] = scalar(axis)
    else:
        attrs = {**attrs, "axis": axis % len(shape)}
    initializers = [name for name in ("dft_length", "axis") if inputs.get(name) is not None]
    check_op("DFT", inputs, attrs=attrs, opset=opset, initializers=initializers, rtol=RTOL, atol=ATOL)


def test_irfft_of_a_real_signals_spectrum():
    """inverse + onesided (an IRFFT) of numpy's rfft gives the signal back, as onnxruntime does."""
    signal = rand(2, 10, 3, seed=12).astype(np.float64)
    spectrum = np.fft.rfft(signal, axis=1)
    x = np.stack([spectrum.real, spectrum.imag], axis=-1).astype(np.float32)
    y = check_op("DFT", {"x": x, "dft_length": None, "axis": scalar(1)}, attrs={"inverse": 1, "onesided": 1},
                 opset=20, initializers=["axis"], rtol=RTOL, atol=ATOL)["y"]
    np.testing.assert_allclose(y[..., 0], signal, rtol=RTOL, atol=ATOL)


STFT_CASES = {
    "window_constant": ((2, 64, 1), 6, "constant", None, 1),
    "window_runtime": ((1, 50, 1), 5, "runtime", None, 1),
    "frame_length_only": ((1, 40, 1), 4, None, 10, 1),
    "complex_two_sided": ((2, 30, 2), 7, "constant", None, 0),
}


@pytest.mark.parametrize("case", sorted(STFT_CASES))
def test_stft(case):
    shape, step, window, frame_length, onesided = STFT_CASES[case]
    length = frame_length or 12
    hann = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(length) / length)).astype(np.float32)
    inputs = {"signal": rand(*shape, seed=13), "frame_step": scalar(step),
              "window": hann if window else None, "frame_length": scalar(frame_length) if frame_length else None}
    initializers = ["frame_step"] + (["frame_length"] if frame_length else []) + (["window"] if window == "constant" else [])
    check_op("STFT", inputs, attrs={"onesided": onesided}, opset=17, initializers=initializers, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("bins,length,rate,low,high", [(8, 16, 8192, 0.0, 4096.0), (40, 512, 16000, 20.0, 7600.0),
                                                       (13, 64, 22050, 300.0, 8000.0)])
def test_mel_weight_matrix(bins, length, rate, low, high):
    inputs = {"num_mel_bins": np.array(bins, np.int64), "dft_length": np.array(length, np.int64),
              "sample_rate": np.array(rate, np.int64), "lower_edge_hertz": np.array(low, np.float32),
              "upper_edge_hertz": np.array(high, np.float32)}
    check_op("MelWeightMatrix", inputs, opset=17, initializers=list(inputs), rtol=1e-5, atol=1e-6)
