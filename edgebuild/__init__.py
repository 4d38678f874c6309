"""edgebuild: compile trained models into artifacts that run on Apple Silicon."""

__version__ = "0.1.0"
