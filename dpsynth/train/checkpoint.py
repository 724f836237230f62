"""Checkpoints of the resumable training state (the model directory is `dpsynth.models.directory`).

Training checkpoints (`TrainCheckpointer`, Orbax `CheckpointManager`):

    RUN/checkpoints/<step>/state/   Orbax tree: step, params, frozen, opt_state, rng
    RUN/checkpoints/<step>/meta/    JSON: data position, preset, config, anything the trainer adds

A checkpoint of private state (`private=True`: dp-tune's, in its `.private` state directory)
is owner-only like the rest of that directory (`dpsynth.owner_only`: directories 0700, files
0600), not only behind its parent's 0700: Orbax writes with the umask's modes, so every save
ends by restricting the tree.
"""

from __future__ import annotations

from typing import Any

import jax
import orbax.checkpoint as ocp

from dpsynth import owner_only
from dpsynth.models.directory import CheckpointError, absolute_path
from dpsynth.train.core import TrainState


def _state_tree(state: TrainState) -> dict:
    tree = {"step": state.step, "params": state.params, "frozen": state.frozen, "opt_state": state.opt_state,
            "rng": state.rng}
    if state.noise_state is not None:  # correlated-noise state (BandMF): private, restored for exact resume
        tree["noise_state"] = state.noise_state
    return tree


class TrainCheckpointer:
    """Saves and restores `TrainState` + JSON metadata under `directory` (keeps the last few).

    Saves are synchronous (a kill after `save` returns never loses that checkpoint); Orbax
    writes each step into a temporary directory and renames it when complete, so a kill during
    a save leaves the previous checkpoint intact.
    """

    def __init__(self, directory: str, max_to_keep: int = 2, *, private: bool = False):
        self.directory = absolute_path(directory)
        self.private = private and "://" not in self.directory
        if self.private and jax.process_index() == 0:
            owner_only.make_private_dir(self.directory)
        self._mngr = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=False,
                                                 create=True))

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def save(self, state: TrainState, meta: dict[str, Any]) -> int:
        step = int(jax.device_get(state.step))
        self._mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_state_tree(state)),
                                                      meta=ocp.args.JsonSave(meta)), force=True)
        self._mngr.wait_until_finished()
        if self.private and jax.process_index() == 0:
            owner_only.restrict_tree(self.directory)
        return step

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"{self.directory}: no checkpoint to resume from (drop --resume to start fresh)")
        return self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

    def restore(self, like: TrainState, step: int | None = None) -> tuple[TrainState, dict[str, Any]]:
        """Restores into the structure, shapes and shardings of `like` (e.g. a freshly initialized state)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"{self.directory}: no checkpoint to resume from (drop --resume to start fresh)")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _state_tree(like))
        try:
            out = self._mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                   meta=ocp.args.JsonRestore()))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"{self.directory}/{step}: does not match this run's model/optimizer ({e}); resume with the same "
                "preset and flags, or start a fresh run in a new --out directory") from e
        tree = out.state
        return TrainState(step=tree["step"], params=tree["params"], frozen=tree["frozen"],
                          opt_state=tree["opt_state"], rng=tree["rng"], noise_state=tree.get("noise_state")), out.meta

    def close(self) -> None:
        self._mngr.close()
