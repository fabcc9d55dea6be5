"""Moving a model's weights between workers: parameter reallocation from one parallel layout to
another (``realloc_plan``: what goes where, a pure function; ``realloc``: the messages)."""
