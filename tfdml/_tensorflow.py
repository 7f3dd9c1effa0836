"""TensorFlow for the modules that need it whatever the Keras backend (``tf.data`` in
``tfdml.data``, TFDS in ``datasets``, ``export``, ``compat``, ``models.get_preprocess``):
``from tfdml._tensorflow import tf`` imports it, or raises an ImportError that says what to
install."""

from tfdml._install import TENSORFLOW_INSTALL

try:
    import tensorflow as tf
except ModuleNotFoundError as err:
    if err.name != "tensorflow":
        raise
    raise ImportError(
        "tfdml.data.pk_batches / eval_batches / augment / views, datasets.load(source='tfds'), "
        "export, compat and models.get_preprocess need TensorFlow >= 2.16 (the "
        "core losses, miners, metrics and layers, and tfdml.data.PKDataset, do not). "
        + TENSORFLOW_INSTALL
    ) from err

__all__ = ["tf"]
