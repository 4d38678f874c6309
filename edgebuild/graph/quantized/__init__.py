"""Decomposition passes that rewrite quantised-operator graphs into the QDQ form.

Every form onnxruntime's quantisation tools produce (integer ops, com.microsoft quantised ops)
becomes ``DequantizeLinear -> float op [-> QuantizeLinear]``, with weights as DequantizeLinear of
their int8/uint8 initializers, so backends keep the weights compressed and reproduce the
activation arithmetic with standard ops. One module per source form; docs/quantized-models.md
says what each form becomes.
"""
