"""Saving a :class:`tfdml.models.MetricModel`: files written whole, the random generators'
states kept, and load errors that name the file and what does not fit."""

from __future__ import annotations

import functools
import warnings

import keras
import numpy as np

from tfdml._files import raise_if_incomplete, save_atomically

__all__ = ["StateSaving"]


class StateSaving:
    """The saving methods of :class:`tfdml.models.MetricModel` (a mixin before ``keras.Model``)."""

    #: The entry of the model's own saved variables that holds the states of its random
    #: generators (``[n, 2]``: each ``keras.random.SeedGenerator``'s seed and counter).
    SEED_STATES_KEY = "seed_states"

    def _seed_states(self):
        """The state variables of every ``keras.random.SeedGenerator`` of the model.

        Those of the embedder (``Dropout``, random augmentation layers) and of the
        loss's random miners, in the order of ``non_trainable_variables`` (the same
        for every model built from the same config). Keras saves a layer's own
        variables but not its generators' states, so that a loaded model would draw
        from the initial seed again (or, for ``seed=None``, from a new random one).
        """
        seen, states = set(), []
        for v in self.non_trainable_variables:
            # The name Keras gives the variable of every SeedGenerator.
            if v.name == "seed_generator_state" and id(v) not in seen:
                seen.add(id(v))
                states.append(v)
        return states

    def save_own_variables(self, store):
        """Keras' own variables, and the states of the random generators (class docstring)."""
        super().save_own_variables(store)
        states = self._seed_states()
        if states:
            store[self.SEED_STATES_KEY] = np.stack([np.asarray(keras.ops.convert_to_numpy(v))
                                                    for v in states])

    def load_own_variables(self, store):
        """Loads Keras' own variables and the random generators' states.

        Raises:
            ValueError: when the file holds another number of generator states
                than this model has (another embedder or miner).
        """
        keys = list(store.keys())
        own = {k: store[k] for k in keys if k != self.SEED_STATES_KEY}
        super().load_own_variables(own)
        states = self._seed_states()
        if self.SEED_STATES_KEY not in keys:
            if states:
                warnings.warn(
                    f"The file loaded into MetricModel {self.name!r} holds no random generator "
                    "states (it was written before tfdml saved them): its random layers and "
                    "miners draw from their initial seeds again, so training does not resume "
                    "exactly.", stacklevel=2)
            return
        saved = np.asarray(store[self.SEED_STATES_KEY])
        if saved.shape != (len(states), 2):
            raise ValueError(
                f"The file holds {saved.shape[0] if saved.ndim else 0} random generator "
                f"state(s) and MetricModel {self.name!r} has {len(states)} (random layers of "
                "the embedder and random miners of the loss): it was saved from another model.")
        for variable, value in zip(states, saved, strict=True):
            variable.assign(value.astype(variable.dtype))

    def save(self, filepath, overwrite=True, zipped=None, **kwargs):
        """``keras.Model.save``, written whole or not at all (:func:`tfdml.models.save_model`).

        The random generators' states are saved with the variables (see
        :meth:`save_own_variables`), so that training resumes exactly.
        """
        save_atomically(functools.partial(keras.Model.save, self), filepath,
                        overwrite=overwrite, zipped=zipped, **kwargs)

    def save_weights(self, filepath, overwrite=True, **kwargs):
        """``keras.Model.save_weights``, written whole or not at all.

        The weights go to a temporary file beside ``filepath``, which is
        flushed to disk and renamed over it once complete: a full disk, an
        error or a kill part-way leaves the previous file as it was (and
        loadable), and the process goes on after a failed save.
        """
        save_atomically(functools.partial(keras.Model.save_weights, self), filepath,
                        overwrite=overwrite, weights_only=True, **kwargs)

    def load_weights(self, filepath, skip_mismatch=False, **kwargs):
        """``keras.Model.load_weights``, with errors that name the file and what does not fit.

        The loss's state is saved with the class name of its loss and loads
        into the state of the same class only, with the same shapes.

        Raises:
            ValueError: naming ``filepath``, when the file holds the state of
                another loss class (e.g. ``ProxyAnchorLoss`` weights loaded
                into an ``ArcFaceLoss`` model), or variables of other shapes
                (another ``num_classes`` or embedding size), or when Keras
                refuses it for another reason.
            tfdml._files.CorruptFileError: (a ``ValueError`` and an
                ``OSError``) for a file that is truncated or corrupt, naming it.
        """
        states = []
        pending = [] if self.loss_state is None else [self.loss_state]
        while pending:
            state = pending.pop()
            states.append(state)
            state.load_problem = None
            pending.extend(getattr(state, "wrapped_states", ()))
        try:
            return super().load_weights(filepath, skip_mismatch=skip_mismatch, **kwargs)
        except Exception as error:
            raise_if_incomplete(filepath, error)
            problems = [s.load_problem for s in states if s.load_problem]
            if problems:
                raise ValueError(
                    f"{filepath} does not fit MetricModel {self.name!r}, whose loss is "
                    f"{type(self.metric_loss).__name__}: {'; '.join(problems)}. Received: "
                    f"filepath={str(filepath)!r}") from error
            if isinstance(error, ValueError):
                raise ValueError(f"Cannot load {filepath} into MetricModel {self.name!r}: "
                                 f"{error}") from error
            raise
