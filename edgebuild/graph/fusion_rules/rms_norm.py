"""RMS normalisation written out -> ``SimplifiedLayerNormalization`` (onnxruntime's RMSNorm).

Llama-style decoders export ``x * 1/sqrt(mean(x^2) + eps) * w``, often with casts to float32
around the statistics; Gemma's ``(1 + w)`` is a constant once folded. onnxscript's own
onnxruntime fusion rules cover these spellings, so they are used as they are. onnxruntime
registers the op in the ONNX domain at opset 1: the fused graph runs in onnxruntime at the
model's own opset, and no opset raise is needed.
"""

from __future__ import annotations

from onnxscript.rewriter import pattern


def rules() -> list[pattern.RewriteRule]:
    # New rule objects per run: the library's module-level ones would hold the last graph matched.
    from onnxscript.rewriter.ort_fusions.rms_normalization import RmsNormFusion

    return [RmsNormFusion.rule(f"rms_norm_{'scale_last' if order else 'scale_first'}", _mul_order=order)
            for order in (False, True)]
