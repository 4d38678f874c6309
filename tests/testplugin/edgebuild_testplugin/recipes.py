"""Recipe texts the tests write."""

# the recipe ``project`` writes beside tiny.onnx (models.tiny_model); {extra} takes more sections
RECIPE = """\
edgebuild: 1
name: tiny
source:
  model: tiny.onnx
  inputs: {{x: {{shape: [2, 4], dtype: float32}}}}
target: {{backend: testcopy, precision: float32}}
{extra}
outputs: {{dir: out}}
"""

# seven lines on m.onnx (x: float32 [n, 4]) with the test backend: the recipe-error tables append
# one mistake from line 8 (a backend's own checks put its name in place of testcopy)
BASE_RECIPE = """\
edgebuild: 1
name: tiny
source:
  model: m.onnx
  inputs:
    x: {shape: [2, 4], dtype: float32}
target: {backend: testcopy, precision: float32}
"""
