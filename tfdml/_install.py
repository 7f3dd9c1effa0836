"""What to install for TensorFlow, for the error messages that ask for it."""

TENSORFLOW_INSTALL = (
    "Install it with `pip install tfdml[tensorflow]` (or `pip install tensorflow`), or "
    "`pip install tfdml[cpu]` (or `pip install tensorflow-cpu`) for the CPU-only wheel."
)
