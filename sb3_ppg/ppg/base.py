"""``PPGBase``: what PPG needs around its training loop: optimizer steps, save/load, set_env, the aux buffer on disk."""

import inspect
import io
import json
import os
import pathlib
import warnings
import zipfile
from collections.abc import Callable, Iterable
from typing import Any, NoReturn, TypeVar

import torch as th
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.save_util import json_to_data, open_path
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback
from stable_baselines3.common.utils import check_for_correct_spaces, explained_variance
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppg.common import data_parallel, distributed
from sb3_ppg.common.array_files import atomic_write
from sb3_ppg.common.buffers import AuxiliaryBuffer, Minibatch, split_minibatch
from sb3_ppg.common.checkpoints import resume
from sb3_ppg.common.checkpoints.checkpoint import iter_callbacks
from sb3_ppg.common.hyperparameters import (
    HyperparameterError,
    check_aux_buffer_memory,
    check_load_arguments,
    check_saved_optimizers,
    gradient_norm,
    load_arguments,
    resolve_batch_size,
    schedule_value,
)
from sb3_ppg.ppg import losses
from sb3_ppg.ppg.policies import PPGPolicy

SelfPPGBase = TypeVar("SelfPPGBase", bound="PPGBase")

#: What ``load_checkpoint()`` cannot change: the stored rollouts and the auxiliary buffer are laid out for them
RUN_LAYOUT_HYPERPARAMETERS = ("n_steps", "n_policy_iters")


class SavedPolicyClass:
    """
    The policy class as a PPG model zip stores it. ``PPG.load`` unwraps it. Any other algorithm's ``load()`` (SB3's
    ``PPO.load``, ...) takes it for the policy class, and building the policy with it raises a ``ValueError`` saying
    that the file holds a PPG model, instead of a cryptic error or a PPG model trained by another algorithm. Model
    zips name this class by its import path (``sb3_ppg.ppg.base.SavedPolicyClass``): it must stay importable there.

    :param policy_class: the model's policy class
    """

    def __init__(self, policy_class: type[PPGPolicy]) -> None:
        self.policy_class = policy_class

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ValueError(
            f"This model zip holds a PPG model (sb3_ppg.PPG, policy {_class_name(self.policy_class)}), not a model of "
            "the algorithm loading it: load it with sb3_ppg.PPG.load(path) (or PPG.load_checkpoint(folder) for a "
            "checkpoint)."
        )

    def __repr__(self) -> str:
        return f"SavedPolicyClass({_class_name(self.policy_class)})"


def _class_name(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"


def _zip_destination(path: str | pathlib.Path) -> pathlib.Path:
    """
    The file SB3's ``save`` writes for a path: ".zip" appended to a path without suffix, ``<path>_2`` when the path is
    a folder (with SB3's warning); a symbolic link is followed (the file it points to is replaced).
    """
    path = pathlib.Path(path)
    while True:
        if path.suffix == "":
            path = pathlib.Path(f"{path}.zip")
        if not path.is_dir():
            break
        warnings.warn(f"Path '{path}' is a folder. Will save instead to {path}_2")
        path = pathlib.Path(f"{path}_2")
    return pathlib.Path(os.path.realpath(path)) if path.is_symlink() else path


def _read_model_zip(path: str | pathlib.Path | io.BufferedIOBase) -> tuple[dict[str, Any], set[str]] | None:
    """
    The ``data`` of a model zip as plain JSON (nothing in it is unpickled) and the names of its members; None when the
    file cannot be read as a model zip (SB3's ``load`` then says why). A file object is read from and put back at its
    position.
    """
    try:
        file = open_path(path, "r", suffix="zip")
    except (OSError, ValueError, TypeError):
        return None
    own_file = isinstance(path, (str, pathlib.Path))
    position = None if own_file else file.tell()
    try:
        with zipfile.ZipFile(file) as archive:
            data = json.loads(archive.read("data"))
            members = set(archive.namelist())
        return (data, members) if isinstance(data, dict) else None
    except (zipfile.BadZipFile, KeyError, OSError, ValueError, EOFError):
        return None
    finally:
        if own_file:
            file.close()
        else:
            file.seek(position)


def _saved_policy_class(data: dict[str, Any], custom_objects: dict[str, Any] | None) -> Any:
    """The policy class a model zip's ``data`` names (unwrapped from a ``SavedPolicyClass``), or None if unreadable."""
    if custom_objects is not None and "policy_class" in custom_objects:
        policy_class = custom_objects["policy_class"]
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SB3's warning for an object that cannot be unpickled
                policy_class = json_to_data(json.dumps({"policy_class": data.get("policy_class")})).get("policy_class")
        except Exception:  # e.g. the module of another library's policy is not installed: SB3's load says so
            return None
    return policy_class.policy_class if isinstance(policy_class, SavedPolicyClass) else policy_class


def _check_ppg_model(where: str, data: dict[str, Any], policy_class: Any) -> None:
    """Refuse a model zip of another algorithm (its policy is not a ``PPGPolicy``), naming the algorithm when known."""
    if policy_class is None or (isinstance(policy_class, type) and issubclass(policy_class, PPGPolicy)):
        return
    name = _class_name(policy_class)
    if getattr(policy_class, "__module__", "") == "stable_baselines3.common.policies" and "n_steps" in data:
        algorithm = "PPO" if "clip_range" in data else "A2C"
        how = f"It is a model of SB3's {algorithm}: load it with stable_baselines3.{algorithm}.load(path)."
    else:
        how = "Load it with the class of the algorithm that saved it."
    lacks = ", and it lacks PPG's hyperparameters" if "n_policy_iters" not in data else ""
    raise ValueError(
        f"{where} does not hold a PPG model: its policy is {name}, not a PPG policy (sb3_ppg.PPGPolicy){lacks}. {how}"
    )


def _with_sources(
    error: HyperparameterError, where: str, kwargs: dict[str, Any], custom_objects: dict[str, Any] | None
) -> HyperparameterError:
    """``check_hyperparameters``' error, for a model being loaded: each value says where it came from, and the fix."""

    def source(name: str) -> str:
        if name in kwargs:
            return "given to load()"
        if custom_objects is not None and name in custom_objects:
            return "from custom_objects"
        return "stored in the file"

    problems = [(name, f"{message} ({source(name)})") for name, message in error.problems]
    return HyperparameterError(
        problems,
        header=f"Cannot load {where}: invalid PPG hyperparameters:",
        footer=(
            f"Pass valid values as keyword arguments of load() (e.g. PPG.load(path, env, {problems[0][0]}=...)): they "
            "replace the file's values."
        ),
    )


class PPGBase(OnPolicyAlgorithm):
    """
    The parts of :class:`~sb3_ppg.PPG` around its training loop: one optimizer step (finite check, gradient
    clipping), SB3's ``BaseAlgorithm`` contract (the auxiliary buffer and the extra optimizers in ``save()`` /
    ``load()``, ``set_env()`` with another number of envs) and the auxiliary buffer on disk. ``PPG`` sets every
    attribute used here in its constructor; use ``PPG``, not this class.
    """

    policy: PPGPolicy
    n_policy_iters: int
    n_aux_epochs: int
    aux_buffer: AuxiliaryBuffer | None
    aux_optimizer: th.optim.Optimizer | None
    value_optimizer: th.optim.Optimizer | None
    _auto_batch_size: bool
    _phase_dtypes: dict[str, th.dtype]
    _micro_batch_size: int | None
    _n_aux_phases: int
    _compute_old_distributions: Callable[[], None]
    _train_aux_phase: Callable[[], None]
    max_grad_norm: float | None  # type: ignore[assignment]
    #: Whether the model is at a rollout boundary: ``train()`` has consumed the last rollout collected (or none was
    #: collected yet). False from the start of a rollout until its ``train()`` returns, so also after an exception
    #: (Ctrl-C) inside either: ``PPGCheckpointCallback`` writes a checkpoint only at a boundary.
    _at_rollout_boundary: bool = True

    def _check_aux_buffer_memory(self, n_envs: int) -> None:
        """Check that the auxiliary buffer for ``n_envs`` envs fits in memory, before allocating it."""
        if self.n_aux_epochs > 0:
            args = dict(n_policy_iters=self.n_policy_iters, n_steps=self.n_steps, n_envs=n_envs)
            spaces = dict(observation_space=self.observation_space, action_space=self.action_space)
            check_aux_buffer_memory(AuxiliaryBuffer.estimate_nbytes(**args, **spaces), **args)

    def _make_aux_buffer(self, check_memory: bool = True) -> AuxiliaryBuffer | None:
        """The auxiliary buffer for the current ``n_envs`` (None when the auxiliary phase is off); see above."""
        if check_memory:
            self._check_aux_buffer_memory(self.n_envs)
        if self.n_aux_epochs == 0:
            return None
        return AuxiliaryBuffer(
            self.n_policy_iters, self.n_steps, self.n_envs, self.observation_space, self.action_space, device=self.device
        )

    def _make_optimizer(self) -> th.optim.Optimizer:
        """A new optimizer over all policy parameters, of the policy optimizer's class and settings."""
        return self.policy.optimizer_class(self.policy.parameters(), lr=self.lr_schedule(1), **self.policy.optimizer_kwargs)  # type: ignore[call-arg]

    def learn(
        self: SelfPPGBase,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "PPG",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfPPGBase:
        """SB3's ``learn()``, with PPG's TensorBoard run name (``PPG_1``, ...)."""
        return super().learn(
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )

    # ------------------------------------------------------------------------------------------------------------
    # Data-parallel training (torchrun): hooks into sb3_ppg.common.distributed, which do nothing in a single process
    # ------------------------------------------------------------------------------------------------------------

    def _setup_learn(
        self,
        total_timesteps: int,
        callback: MaybeCallback = None,
        reset_num_timesteps: bool = True,
        tb_log_name: str = "run",
        progress_bar: bool = False,
    ) -> tuple[int, BaseCallback]:
        if distributed.is_active():
            data_parallel.prepare_learn(self, total_timesteps, reset_num_timesteps, callback)
        return super()._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        if distributed.is_active():
            return super()._init_callback(data_parallel.wrap_callback(callback, progress_bar))
        return super()._init_callback(callback, progress_bar)

    def set_random_seed(self, seed: int | None = None) -> None:
        """Seed the generators; in data-parallel training rank ``r`` uses ``seed + r * n_envs`` (distinct env seeds)."""
        if seed is not None and distributed.is_active():
            seed += distributed.get_rank() * self.n_envs
        super().set_random_seed(seed)

    def save(
        self,
        path: str | pathlib.Path | io.BufferedIOBase,
        exclude: Iterable[str] | None = None,
        include: Iterable[str] | None = None,
    ) -> None:
        """
        SB3's ``save``, atomic for a path: the zip is written to a temporary file in the same folder, flushed to disk
        and renamed over the destination, so that a failure (a full disk, Ctrl-C, a kill) leaves the previous file
        intact and no partial file. Paths follow SB3's rules (".zip" is appended to a path without suffix, missing
        folders are created); a file object is written directly. The zip stores the policy class wrapped in a
        :class:`SavedPolicyClass`, so that another algorithm's ``load()`` refuses it clearly. In data-parallel training
        only rank 0 writes (every rank holds the same model).

        :param path: path to the file where the model should be saved, or a writable binary file object
        :param exclude: name of parameters that should be excluded in addition to the default ones
        :param include: name of parameters that might be excluded but should be included anyway
        """
        if distributed.get_rank() != 0:
            return
        if isinstance(path, (str, pathlib.Path)):
            destination = _zip_destination(path)
            destination.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(destination, lambda file: self._write_zip(file, exclude, include))
        else:
            self._write_zip(path, exclude, include)

    def _write_zip(
        self, file: io.BufferedIOBase, exclude: Iterable[str] | None = None, include: Iterable[str] | None = None
    ) -> None:
        """Write the model zip (SB3's format) to a file object, with the policy class wrapped (see ``save``)."""
        policy_class = self.policy_class
        self.policy_class = SavedPolicyClass(policy_class)  # type: ignore[assignment]
        try:
            super().save(file, exclude=exclude, include=include)
        finally:
            self.policy_class = policy_class

    def _average_gradients(self) -> None:
        """Average the gradients over the ranks before a step (data-parallel training only)."""
        if distributed.is_active():
            distributed.average_gradients(self.policy.parameters())

    def collect_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """
        SB3's ``collect_rollouts()``, after telling the callbacks that want to know (``PPGCheckpointCallback``) that
        this is a rollout boundary: ``train()`` has consumed the previous rollout and nothing of the next one has
        been drawn yet. In data-parallel training, the ranks then share its outcome (steps, statistics).
        """
        for child in iter_callbacks(callback):
            if hasattr(child, "on_rollout_boundary"):
                child.on_rollout_boundary()
        self._at_rollout_boundary = False  # until train() has consumed this rollout
        if distributed.is_active():
            return data_parallel.collect_rollouts(
                self, lambda: super(PPGBase, self).collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
            )
        return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)

    def _finish_interrupted_aux_phase(self) -> None:
        """Run an auxiliary phase that an exception (or Ctrl-C) interrupted, from its start, if there is one."""
        if self.aux_buffer is not None and self.aux_buffer.full():
            warnings.warn(
                "The last auxiliary phase was interrupted: it runs again from its start on the stored rollouts "
                "(the updates it had made are kept) before this iteration's rollout is stored."
            )
            self._run_aux_phase()

    def _run_aux_phase(self) -> None:
        """
        Compute the old policy on the full auxiliary buffer, run the auxiliary phase and empty the buffer. When the
        phase is interrupted (an exception, Ctrl-C) the buffer stays full, so that the model stays usable: the
        next ``train()`` runs the phase again, and the error says how to resume.
        """
        self.policy.compute_dtype = self._phase_dtypes["aux"]
        try:
            self._compute_old_distributions()
            self._train_aux_phase()
        except BaseException as error:
            if hasattr(error, "add_note"):
                error.add_note(
                    f"PPG: interrupted during the auxiliary phase at timestep {self.num_timesteps} (auxiliary phase "
                    f"{self._n_aux_phases + 1}). The model stays usable: learn() again reruns that phase from its start. "
                    "To resume exactly instead, load the last checkpoint written by PPGCheckpointCallback with "
                    "PPG.load_checkpoint(); it is left intact."
                )
            raise
        finally:
            self.policy.compute_dtype = self._phase_dtypes["rollout"]
        self.aux_buffer.reset()  # type: ignore[union-attr]

    def _log_policy_phase(
        self,
        stats: dict[str, list[th.Tensor]],
        loss: th.Tensor,
        clip_range: float | None,
        clip_range_vf: float | None,
        continue_training: bool,
    ) -> None:
        """Record the policy phase's diagnostics (means over its minibatches; approx_kl over the last epoch)."""
        for name in ("entropy_loss", "policy_gradient_loss", "value_loss", "approx_kl", "clip_fraction", "kl_penalty"):
            if stats.get(name):
                self.logger.record(f"train/{name}", th.stack(stats[name]).mean().item())
        explained_var = explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())
        self.logger.record("train/loss", loss.item())
        self.logger.record("train/explained_variance", explained_var)
        if hasattr(self.policy, "log_std"):
            self.logger.record("train/std", th.exp(self.policy.log_std).mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        if clip_range is not None:
            self.logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)
        if not continue_training and self.verbose >= 1:
            print(f"Early stopping of the policy phase: approx_kl reached 1.5 * target_kl = {1.5 * self.target_kl:.4f}")

    def _schedule_value(self, name: str, progress_remaining: float) -> float | None:
        """
        The value at ``progress_remaining`` of the schedule ``name`` (``"learning_rate"``, ``"aux_learning_rate"``,
        the learning rate's when None, ``"clip_range"``, ``"clip_range_vf"``), checked; None for a clip range of None.
        """
        schedule = self.lr_schedule if name == "learning_rate" else getattr(self, name)
        if name == "aux_learning_rate" and schedule is None:
            name, schedule = "learning_rate", self.lr_schedule
        return None if schedule is None else schedule_value(schedule, name, progress_remaining)

    def _update_current_progress_remaining(self, num_timesteps: int, total_timesteps: int) -> None:
        """
        SB3's remaining progress (``1 - num_timesteps / total_timesteps``), kept at 0 once the total is reached:
        the last rollout may end beyond ``total_timesteps`` (its length is ``n_steps * n_envs``), and schedules are
        functions of a progress from 1 to 0 (a linear schedule would otherwise give a negative learning rate).

        :param num_timesteps: current number of timesteps
        :param total_timesteps: the total number of timesteps of this ``learn()``
        """
        self._current_progress_remaining = max(0.0, 1.0 - float(num_timesteps) / float(total_timesteps))

    def _update_learning_rate(self, optimizers: list[th.optim.Optimizer] | th.optim.Optimizer) -> None:
        """SB3's learning-rate update, after checking the schedule's value (a ``ValueError`` names a bad one)."""
        self._schedule_value("learning_rate", self._current_progress_remaining)
        super()._update_learning_rate(optimizers)

    def _backward(
        self,
        minibatch: Minibatch,
        compute_loss: Callable[[Minibatch], tuple[th.Tensor, losses.Diagnostics]],
        phase: str,
        divisor: int = 1,
    ) -> tuple[th.Tensor, losses.Diagnostics]:
        """
        Compute a minibatch's loss, check it and backpropagate ``loss / divisor`` (adding to the gradients). With
        ``micro_batch_size``, a larger minibatch runs as micro-batches, one forward and backward pass each, with their
        losses weighted by their share of the samples: the same gradient up to float rounding, with the activations
        of one micro-batch at a time.

        :param minibatch: the minibatch
        :param compute_loss: its loss (a mean over the samples) and diagnostics (means as well)
        :param phase: "policy" or "auxiliary", for the error message of a non-finite loss
        :param divisor: what the loss is divided by (the minibatches of an accumulated gradient)
        :return: the minibatch's loss (detached) and diagnostics
        """
        results = []
        for micro_batch, share in split_minibatch(minibatch, self._micro_batch_size):
            loss, diagnostics = compute_loss(micro_batch)
            self._check_finite(loss, phase)
            (loss * share / divisor).backward()
            results.append((share, loss.detach(), diagnostics))
        if len(results) == 1:
            return results[0][1], results[0][2]
        total_loss = sum(share * loss for share, loss, _ in results)
        names = results[0][2].keys()
        return total_loss, {name: sum(share * diagnostics[name] for share, _, diagnostics in results) for name in names}  # type: ignore[misc]

    def _step(self, optimizer: th.optim.Optimizer, phase: str) -> None:
        """Average the gradients over the ranks, check and clip them, step the optimizer and clear them."""
        self._average_gradients()
        self._clip_gradients(phase)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def _clip_gradients(self, phase: str) -> None:
        """
        Clip the global gradient norm to ``max_grad_norm`` (when set), after checking that the gradients are
        finite: a finite loss can still have inf or NaN gradients, which must not reach the weights.

        :param phase: "policy" or "auxiliary", for the message
        :raises FloatingPointError: when the gradients' global norm is not finite (the gradients are cleared)
        """
        if self.max_grad_norm is not None:
            total_norm = th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        else:
            total_norm = gradient_norm(self.policy.parameters())
        if not th.isfinite(total_norm).item():
            self.policy.zero_grad(set_to_none=True)
            raise FloatingPointError(
                f"PPG's {phase}-phase gradients have a non-finite norm ({total_norm.item()}) at timestep "
                f"{self.num_timesteps} although the loss is finite: training stopped before the weights were updated "
                "with them. Common causes: a learning rate that is too high (lower learning_rate / "
                "aux_learning_rate), observations or rewards on a huge scale (use VecNormalize), or a custom network "
                "or features extractor whose gradient is not finite somewhere (e.g. sqrt or log at 0)."
            )

    def _check_finite(self, loss: th.Tensor, phase: str) -> None:
        """
        Stop training with a clear error when a loss is NaN or infinite (before it corrupts the weights).

        :param loss: the loss about to be backpropagated
        :param phase: "policy" or "auxiliary", for the message
        """
        if not th.isfinite(loss).item():
            raise FloatingPointError(
                f"PPG's {phase}-phase loss is {loss.item()} at timestep {self.num_timesteps}: training stopped before "
                "the weights were updated with it. Common causes: NaN/inf rewards or observations from the "
                "environment (check them, e.g. with VecCheckNan), rewards on a huge scale (use VecNormalize), or a "
                "learning rate that is too high (lower learning_rate / aux_learning_rate or set max_grad_norm)."
            )

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfPPGBase],
        path: str | pathlib.Path | io.BufferedIOBase,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfPPGBase:
        """
        Load the model from a zip file (see SB3's ``BaseAlgorithm.load``). The hyperparameters it is loaded with (the
        file's, replaced by ``custom_objects`` and the keyword arguments) are checked as the constructor checks its
        arguments, and keyword arguments mean what they mean there (``batch_size=None``: 8 minibatches;
        ``n_value_epochs=None``: ``n_epochs``; a new ``n_epochs`` keeps joint value epochs joint). Changes that would add
        or drop an optimizer (``n_aux_epochs`` 0 or not, ``separate_aux_optimizer``, ``n_value_epochs`` equal to
        ``n_epochs`` or not) are refused: the saved optimizers are restored as they are. Every other hyperparameter may
        change (the rollout and auxiliary buffers are rebuilt; the auxiliary buffer is not saved anyway).

        :param path: path to the file (".zip" is tried after the path as given), or a readable binary file object
        :param env: the environment to run the loaded model on (None: prediction only)
        :param device: the device of the model
        :param custom_objects: objects that replace those of the file with the same names (see SB3's ``load``)
        :param print_system_info: whether to print the system info of the saved model and of this system
        :param force_reset: reset the env before training (SB3's default) rather than continuing its last observation
        :param kwargs: hyperparameters (or other attributes) that replace the file's
        :return: the model
        :raises HyperparameterError: (a ``ValueError``) naming each invalid, missing or unknown hyperparameter and where
            it came from, or a change that would add or drop an optimizer
        :raises ValueError: when the file holds a model of another algorithm (naming it) or is truncated or corrupt
        """
        where = repr(str(path)) if isinstance(path, (str, pathlib.Path)) else "the model file"
        given = dict(kwargs)
        saved = _read_model_zip(path)
        if saved is not None:
            data, members = saved
            _check_ppg_model(where, data, _saved_policy_class(data, custom_objects))
            check_load_arguments(given, data, inspect.signature(cls.__init__).parameters, where)
            replaced = {name: value for name, value in (custom_objects or {}).items() if name in data}
            kwargs = load_arguments(given, {**data, **replaced})
            check_saved_optimizers({**data, **replaced, **kwargs}, members, {*replaced, *given}, where)
        try:
            return super().load(
                path,
                env=env,
                device=device,
                custom_objects=custom_objects,
                print_system_info=print_system_info,
                force_reset=force_reset,
                **kwargs,
            )
        except HyperparameterError as error:
            raise _with_sources(error, where, given, custom_objects) from None
        except AssertionError as error:
            # SB3 asserts when a truncated zip still opens (the nested policy.pth zip's directory is found)
            if "No data found" in str(error):
                raise ValueError(f"{path!r} is not a complete PPG model zip (truncated or corrupt file).") from error
            raise

    @classmethod
    def load_checkpoint(
        cls: type[SelfPPGBase],
        path: str | os.PathLike,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        **kwargs: Any,
    ) -> SelfPPGBase:
        """
        Load a checkpoint written by :class:`~sb3_ppg.PPGCheckpointCallback`, ready to continue the run:
        ``model.learn(total_timesteps - model.num_timesteps, reset_num_timesteps=False)`` (SB3 counts the steps of
        ``learn()`` from the current ``num_timesteps``) ends, on CPU with a seed, with the same parameters, bit for
        bit, as the run that was never interrupted. Every file is checked against the manifest's checksums first.
        Under torchrun every rank calls it and restores its own part (envs, random generators, auxiliary buffer),
        with the checkpoint's world size. Checkpoints hold pickles (the model zip, DummyVecEnv envs): load trusted ones.

        :param path: a checkpoint folder, or the callback's ``save_path``: then the newest checkpoint (the one written
            last) that verifies is used, and a warning names the damaged newer ones it skipped
        :param env: the env to continue with, built as in the run (same wrappers, same number of envs); the states
            of its envs are restored (the envs of a ``DummyVecEnv`` are replaced by their saved copies). Where they
            could not be saved, the episodes restart, with a warning. ``None``: the model comes without env.
        :param device: the device of the model
        :param kwargs: passed to :meth:`load` (e.g. ``custom_objects``, ``verbose``, ``tensorboard_log``), checked as
            there. Hyperparameters given here apply from the checkpoint on (the run then no longer repeats the
            uninterrupted one); ``n_steps`` and ``n_policy_iters`` cannot change (the stored rollouts and the auxiliary
            buffer are laid out for them): start anew from the checkpoint's ``model.zip`` with :meth:`load` for that
        :return: the model
        :raises FileNotFoundError: when ``path`` holds no complete checkpoint
        :raises ValueError: when the checkpoint ``path`` is damaged (naming the newest older one that verifies), every
            checkpoint of the folder ``path`` is damaged, or the checkpoint does not fit ``env`` or the world size;
            ``HyperparameterError`` (a ``ValueError``) for invalid hyperparameters or ones that cannot change
        """
        layout = {name: kwargs.pop(name) for name in RUN_LAYOUT_HYPERPARAMETERS if name in kwargs}
        model = resume.load_checkpoint(cls, path, env=env, device=device, **kwargs)
        changed = [(name, value) for name, value in layout.items() if value != getattr(model, name)]
        if changed:
            raise HyperparameterError(
                [(name, f"{name}={value!r} given, the run has {name}={getattr(model, name)!r}") for name, value in changed],
                header=f"load_checkpoint({str(path)!r}) continues the run, whose rollouts and auxiliary buffer are laid "
                "out for its n_steps and n_policy_iters: they cannot change.",
                footer="Leave them out to resume the run, or start anew from the checkpoint's weights with other values: "
                "PPG.load('<checkpoint folder>/model.zip', env, n_steps=...).",
            )
        return model  # type: ignore[return-value]

    def _maybe_recommend_cpu(self, mlp_class_name: str = "PPGPolicy") -> None:
        super()._maybe_recommend_cpu(mlp_class_name)

    def _excluded_save_params(self) -> list[str]:
        excluded = ["aux_buffer", "aux_optimizer", "value_optimizer", "_distributed_stats_base", "_at_rollout_boundary"]
        return [*super()._excluded_save_params(), *excluded]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts = ["policy", "policy.optimizer"]
        if self.aux_optimizer is not None:
            state_dicts.append("aux_optimizer")
        if self.value_optimizer is not None:
            state_dicts.append("value_optimizer")
        return state_dicts, []

    def set_env(self, env: GymEnv, force_reset: bool = True) -> None:
        """
        Set a new environment. Unlike SB3's PPO, the number of environments may change: the rollout and auxiliary
        buffers are then rebuilt (rollouts already in the auxiliary buffer are dropped, with a warning) and the env
        is reset.

        :param env: The environment for learning a policy
        :param force_reset: Force call to ``reset()`` before training
        """
        env = self._wrap_env(env, self.verbose)
        if env.num_envs == self.n_envs:
            super().set_env(env, force_reset=force_reset)
            return
        # Check everything before changing anything
        check_for_correct_spaces(env, self.observation_space, self.action_space)
        self._check_aux_buffer_memory(env.num_envs)
        self.batch_size = resolve_batch_size(self, env.num_envs)
        if self.aux_buffer is not None and self.aux_buffer.n_rollouts > 0:
            warnings.warn(
                f"set_env() changes the number of environments from {self.n_envs} to {env.num_envs}: the "
                f"{self.aux_buffer.n_iterations} policy iterations in the auxiliary buffer are dropped and the next "
                "auxiliary phase waits for n_policy_iters new ones."
            )
        self.n_envs = env.num_envs
        super().set_env(env, force_reset=True)
        self.rollout_buffer = self.rollout_buffer_class(  # type: ignore[misc]
            self.n_steps,
            self.observation_space,  # type: ignore[arg-type]
            self.action_space,
            device=self.device,
            gamma=self.gamma,
            gae_lambda=self.gae_lambda,
            n_envs=self.n_envs,
            **self.rollout_buffer_kwargs,
        )
        self.aux_buffer = self._make_aux_buffer(check_memory=False)

    def save_aux_buffer(self, path: str | pathlib.Path | io.BufferedIOBase) -> None:
        """
        Save the auxiliary buffer, so that a run can resume mid-phase without losing data. It is not part of the
        model zip because it can be many GB. The file holds plain arrays (``.npz`` with JSON metadata and a checksum
        of every array), written atomically; nothing is pickled. For resuming a run exactly, prefer the checkpoints
        of :class:`~sb3_ppg.PPGCheckpointCallback`.

        :param path: Path to the file where the buffer should be saved; ".npz" is appended to a str path without
            a suffix
        """
        if self.aux_buffer is None:
            raise ValueError("This model has no auxiliary buffer (n_aux_epochs=0): there is nothing to save.")
        self.aux_buffer.save(path, self.verbose)

    def load_aux_buffer(self, path: str | pathlib.Path | io.BufferedIOBase) -> None:
        """
        Load an auxiliary buffer saved by ``save_aux_buffer``; the rollouts it holds count toward the next
        auxiliary phase. The file is checked completely (checksums, layout, spaces) before the model's buffer is
        replaced; a pickle or any other file gives a ``ValueError`` and nothing in it is executed.

        :param path: Path to the saved buffer
        """
        if self.aux_buffer is None:
            raise ValueError("This model has no auxiliary buffer (n_aux_epochs=0): it cannot load one.")
        buffer = AuxiliaryBuffer.load(path, self.verbose)
        buffer.check_compatible(self.aux_buffer, path)
        buffer.device = self.device
        self.aux_buffer = buffer
