"""The reference epilogues of the CUTLASS export (tests/test_export_cutlass.py checks their
headers against tests/golden/export/, tests/gpu/test_gpu_export_cutlass.py compiles and
runs them): name -> (source, operands, outputs), as ``evtfuse.export.cutlass`` takes them."""

CASES = {
    "alpha_beta": ("""\
def alpha_beta(accum, C, alpha, beta):
    D = alpha * accum + beta * C
    return D
""", None, None),
    "relu_aux": ("""\
def relu_aux(accum, C, alpha, beta):
    F = alpha * accum + beta * C
    D = relu(F)
    return D, F
""", None, None),
    "bias_gelu": ("""\
def bias_gelu(accum, bias):
    D = gelu(accum + bias)
    return D
""", None, None),
    "reductions": ("""\
def reductions(accum, alpha, bias):
    D = alpha * accum + bias
    row_max = max(D)
    col_sum = sum(D)
    total = sum(D)
    return D, row_max, col_sum, total
""", None, {"row_max": "row", "col_sum": "col", "total": "scalar"}),
    "shared": ("""\
def shared(accum, C, scale):
    x = accum * scale + C
    D = relu(x) * sigmoid(x)
    return D
""", {"scale": "row"}, None),
    "functors": ("""\
def functors(accum, C, aux):
    y = softplus(accum, beta=2.0) + leaky_relu(C, slope=0.2)
    D = where(aux > 0.0, y, exp(-abs(aux)))
    return D
""", None, None),
}
