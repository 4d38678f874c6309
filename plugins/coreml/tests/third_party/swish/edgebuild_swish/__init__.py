"""edgebuild-swish: ``mydomain::Swish2`` (``x * sigmoid(beta * x)``) for edgebuild's Core ML backend,
written as a plugin author outside edgebuild would, against ``edgebuild.plugin`` alone."""

DOMAIN = "mydomain"
OP_TYPE = "Swish2"
