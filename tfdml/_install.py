"""What to install for TensorFlow, for the error messages that ask for it."""

TENSORFLOW_INSTALL = (
    "Install it with `pip install tensorflow` (or, in a clone of tfdml, `pip install "
    "\".[tensorflow]\"`), or `pip install tensorflow-cpu` (`pip install \".[cpu]\"`) for the "
    "CPU-only wheel."
)
