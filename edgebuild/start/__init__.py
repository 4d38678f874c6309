"""Starting from a model file: ``edgebuild init`` (a recipe read off the graph) and
``edgebuild convert`` (that recipe, written beside the output and built in one command)."""
