"""The state of a loss: its variables, in a layer that the model training it owns."""

from __future__ import annotations

import keras
import numpy as np

__all__ = ["LossState"]


class LossState(keras.layers.Layer):
    """The variables of a loss, in a layer that a model owns (:class:`tfdml.models.MetricModel`).

    A loss's state is everything that changes while it trains: the seed of a
    random miner (``keras.random.SeedGenerator``, a non-trainable variable),
    learned variables (:class:`MarginLoss`'s beta, the proxies and class
    weights of the proxy and classification losses) and buffers
    (:class:`CrossBatchMemory`'s bank). Each loss keeps them in one
    ``LossState``, which holds the states of wrapped losses as sublayers. The
    layer is not part of any computation (``call`` returns its input): it is
    the one place where the variables live, so that a model that tracks it
    trains, saves, restores and (under JAX) updates them like its own.

    Subclasses create their variables in ``make_variables(embedding_dim)``,
    called once by :meth:`build` with ``input_shape = (None, embedding_dim)``.

    Args:
        seed_generators: the ``keras.random.SeedGenerator`` of the loss's
            miners.
        children: the ``LossState`` of wrapped losses.
        needs_embedding_dim: the variables' shapes depend on the embedding
            size (proxies, memory banks).
    """

    def __init__(self, seed_generators=(), children=(), needs_embedding_dim=False, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.seed_generators = list(seed_generators)
        self.wrapped_states = [c for c in children if c is not None]
        self.needs_embedding_dim = bool(needs_embedding_dim) or any(
            c.needs_embedding_dim for c in self.wrapped_states)
        self.embedding_dim = None

    def build(self, input_shape=None):
        dim = None if input_shape is None else input_shape[-1]
        if self.needs_embedding_dim:
            if dim is None:
                raise ValueError(
                    f"The state of loss {self.name!r} depends on the embedding size, which "
                    "is not known: build the embedding model first (give it an Input) or "
                    "pass `embedding_dim` to the loss."
                )
            self.embedding_dim = int(dim)
        for child in self.wrapped_states:
            if not child.built:
                child.build(input_shape)
        self.make_variables(self.embedding_dim)
        self.built = True

    def make_variables(self, embedding_dim):
        """Creates the variables (subclasses); ``embedding_dim`` may be None."""

    def call(self, inputs):
        return inputs

    # -- saving and loading: a state loads only into the state of the same loss -------------------

    #: The entry of a saved state that names the class of its loss.
    LOSS_CLASS_KEY = "loss_class"
    #: The class name of the loss that owns this state (set by ``MetricLoss.state``).
    loss_class_name = None

    def save_own_variables(self, store):
        """Saves the variables as Keras does, and the class name of the loss."""
        super().save_own_variables(store)
        if self.loss_class_name:
            store[self.LOSS_CLASS_KEY] = np.frombuffer(self.loss_class_name.encode(), np.uint8)

    def load_own_variables(self, store):
        """Loads the variables as Keras does, after checking that they fit.

        Raises:
            ValueError: when ``store`` holds the state of another loss class
                (files written since the class is saved), or other variables:
                another number, or other shapes (e.g. another ``num_classes``
                or embedding size). The message says what differs; it is also
                kept in ``load_problem`` (``None`` after a successful load),
                where :meth:`tfdml.models.MetricModel.load_weights` reads it to
                name the file.
        """
        mine = {}
        super().save_own_variables(mine)  # this state's variables, keyed as Keras saves them
        keys = [k for k in store.keys() if k != self.LOSS_CLASS_KEY]
        if not keys and mine and getattr(self, "load_problem", None):
            # Keras tries the other paths to this layer after a failure (with nothing there):
            # keep the first, real, problem.
            raise ValueError(f"Cannot load the state of loss {self.loss_class_name or self.name}: "
                             f"{self.load_problem}.")
        problems = []
        saved_class = None
        if self.LOSS_CLASS_KEY in store.keys():
            saved_class = bytes(np.asarray(store[self.LOSS_CLASS_KEY], np.uint8)).decode(
                errors="replace")
        if saved_class and self.loss_class_name and saved_class != self.loss_class_name:
            problems.append(f"it holds the state of {saved_class}, and this model's loss is "
                            f"{self.loss_class_name}")
        if sorted(keys) != sorted(mine):
            names = [v.name for v in mine.values()]
            problems.append(f"it holds {len(keys)} variable(s) for the state {self.name!r} of "
                            f"{saved_class or 'its loss'}, and this model's has {len(mine)} "
                            f"{names}")
        else:
            for key, variable in mine.items():
                saved, own = tuple(store[key].shape), tuple(variable.shape)
                if saved != own:
                    problems.append(f"variable {variable.name!r} of {self.name!r} has shape "
                                    f"{saved} in the file and {own} in this model"
                                    f"{self._shape_note(saved, own)}")
        if problems:
            self.load_problem = "; ".join(problems)
            raise ValueError(f"Cannot load the state of loss {self.loss_class_name or self.name}: "
                             f"{self.load_problem}.")
        self.load_problem = None
        super().load_own_variables({k: store[k] for k in keys})

    def _shape_note(self, saved, own):
        """What a shape difference means: the number of classes or the embedding size."""
        notes = []
        num_classes = getattr(self, "num_classes", None)
        if num_classes is not None and saved[:1] != own[:1] and own[:1] == (num_classes,):
            notes.append(f"num_classes={saved[0]} in the file, {num_classes} here")
        if (self.needs_embedding_dim and saved[-1:] != own[-1:]
                and own[-1:] == (self.embedding_dim,)):
            notes.append(f"embedding size {saved[-1]} in the file, {self.embedding_dim} here")
        return f" ({'; '.join(notes)})" if notes else ""
