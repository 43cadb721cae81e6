"""The Trainer: config -> algorithm graph -> compiled plan -> executor -> the loop.

The loop is the same for every algorithm; the algorithm is only the graph
(``PPOTrainer`` builds PPO's, ``GRPOTrainer`` GRPO's, ...). A step samples
``rollout_batch_size`` prompts, runs one iteration of the plan, validates when due
(before training, every ``eval_freq`` steps, at the end), logs the metrics, and saves a
checkpoint when due (every ``save_freq`` steps and at the end). ``resume`` picks the
run up from a checkpoint (see :mod:`.checkpoint`).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from ..algorithms.resolve import check_algorithm_args, import_modules, resolve_algorithm
from ..errors import WorkerLostError, WriteError
from ..graph import Graph
from ..runtime.contracts import set_enabled as set_contract_checks
from ..runtime.roles import RoleSpec
from .algorithm_state import AlgorithmState
from .config import PPOConfig, algorithm_attrs
from .determinism import check_determinism
from .metrics import Tracker, nan_streak, recorded_history, timing_metrics
from .progress import StepProgress
from .prompt_log import PromptLog
from .prompt_queue import PromptQueue
from .role_specs import reward_spec, role_specs
from .run_lock import RunLock
from .run_record import ValueHashes, write_run_record
from .trajectory_log import log_trajectories

__all__ = ["Trainer", "PPOTrainer", "GRPOTrainer", "RLOOTrainer", "ReinforcePPTrainer", "ReMaxTrainer", "SafeRLHFTrainer",
           "VAL_SEED_OFFSET"]

log = logging.getLogger("hybridflow.trainer")

VAL_SEED_OFFSET = 1_000_003
"""Validation samples with seed ``config.seed + VAL_SEED_OFFSET``, so validating never moves training's generator."""


class Trainer:
    """Trains ``algorithm`` as ``config`` says.

    ``algorithm`` is anything :func:`~hybridflow.algorithms.resolve.resolve_algorithm` takes: an
    ``@hf.algorithm`` function, a Graph, a built-in's name, ``"package.module:function"`` or a
    graph JSON file. A subclass may set it as a class attribute, as the built-in trainers do
    (``class MyTrainer(Trainer): algorithm = my_algorithm``). ``config.imports`` are imported
    first, so that the ops a graph uses are registered. After construction ``self.algorithm``
    is the algorithm's name and ``self.definition`` the resolved algorithm.
    """

    algorithm: object = "ppo"

    def __init__(self, config: PPOConfig | None = None, *, algorithm: object = None, trackers: list[Tracker] | None = None):
        self.config = config or PPOConfig()
        import_modules(self.config.imports)
        # an unknown name, a bad module path or a bad algorithm_args key fails here, not at train()
        self.definition = resolve_algorithm(algorithm if algorithm is not None else type(self).algorithm)
        self.algorithm: str = self.definition.name
        check_algorithm_args(self.definition, self.config.algorithm_args)
        self.output_dir = Path(self.config.output_dir)
        # a reward server named in the config is the reward source, as if set with set_reward_model
        self._reward_source: Any = self.config.reward_server.source() if self.config.reward_server else None
        self.algorithm_state: AlgorithmState | None = None
        self._trackers = trackers
        self.executor = None
        self.progress: StepProgress | None = None
        self.history: list[dict[str, float]] = []
        self.validations: dict[int, dict[str, float]] = {}
        self.step = 0
        self.resumed_from: Path | None = None
        self.last_checkpoint: Path | None = None
        self._nan_streak = 0
        self.out_of_time = False
        self.target_reached = False
        self.stop_signal: str | None = None
        """'SIGINT' or 'SIGTERM' when a signal stopped the last train() early (see :mod:`.interrupt`)."""
        self._saved_step = 0
        self._lock = RunLock(self.output_dir)
        self.prompts: PromptQueue | None = None
        """The next steps' prompts, up to ``staleness`` drawn ahead (:mod:`.prompt_queue`)."""
        self.prompt_log: PromptLog | None = None
        """Each step's prompt ids, in output_dir/prompts.jsonl (:mod:`.prompt_log`)."""
        self._validation_plan = None
        self.calibration_check = None
        """The drift check of the run's calibration once steps 1-3 ran (:mod:`.calibration_check`), else None."""
        self.value_hashes = None
        """With ``record_hashes``: the digests of every step's node outputs (:class:`~.run_record.ValueHashes`)."""
        self.determinism: str | None = None
        """With ``check_determinism``: its report (bit-identical, or the first edge that differs)."""
        self.written_artifacts: set[Path] = set()
        """trace.json and timing.txt as this trainer wrote them (an earlier run's are kept aside, not replaced)."""
        self._prompt_tokens: dict = {}
        """Token ids of every prompt seen (the dataset is tokenised once, not every epoch)."""

    # -- wiring ------------------------------------------------------------------------
    def set_reward_model(self, reward: Any) -> None:
        """Score with ``reward``: an object with ``score(batch)`` (e.g. RemoteRewardModel) or a compute_score function.

        Called after training started, it replaces the reward source for the steps that follow.
        """
        self._reward_source = reward
        if self.executor is not None:  # the workers build it: a set_reward plan
            from ..compiler.control import control_plan

            role = next(r.name for r in self.graph.roles if r.kind == "reward")
            spec = reward_spec(self.config, self.inputs, reward)
            self.executor.run_plan(control_plan(self.plan, "set_reward", [role]), args={f"{role}.set_reward": spec})

    def build_graph(self) -> Graph:
        """The algorithm's graph with the config's values for the attributes it has."""
        from .setup import ignored_fields, ignored_role_fields

        algorithm = self.definition
        attrs = algorithm_attrs(self.config, algorithm.defaults)
        ignored = ignored_fields(self.config, algorithm.defaults)
        if ignored:
            log.warning("%s has no attribute for %s; these config fields are ignored", self.algorithm, ", ".join(ignored))
        for field, kind in ignored_role_fields(self.config, {r.kind for r in algorithm.roles.values()}).items():
            log.warning("%s has no %s role; the config field %s is ignored", self.algorithm, kind, field)
        return algorithm.build(**attrs)

    def prepare(self) -> None:
        """Build the run without training: data, graph, plan (written to ``plan.json``), executor and engines,
        the checkpoint resumed from, trackers. :meth:`train` calls it when it has not run yet."""
        from ..data import PromptDataset, PromptLoader
        from ..runtime.local import LocalExecutor
        from .progress import PhaseRecorder
        from .resume import check_fresh_start
        from .planning import plan_for_run, plan_summary, read_run_plan, run_machine
        from .run_spec import derive, set_process_threads
        from .setup import check_batch_sizes, check_devices, check_trainable, run_inputs
        from .trackers import build_trackers

        cfg = self.config
        set_contract_checks(cfg.check_contracts)  # HYBRIDFLOW_CHECK_CONTRACTS=0 turns them off whatever this says
        torch.manual_seed(cfg.seed)
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        check_fresh_start(cfg, self.output_dir)
        check_devices(cfg.device_map)
        self.inputs = inputs = run_inputs(cfg, self.output_dir)
        self.actor_path, self.tokenizer, self.max_response_length = inputs.actor_path, inputs.tokenizer, inputs.max_response_length
        self.train_rows, self.val_rows = inputs.train_rows, inputs.val_rows
        self.graph = self.build_graph()
        check_trainable(self.graph)
        check_batch_sizes(self.graph, cfg)
        planned = read_run_plan(cfg, self.graph)  # a plan file's faults before a Ray cluster starts for it
        self.machine = run_machine(cfg)
        set_process_threads(cfg, self.machine)
        self.run_spec = derive(cfg, self.graph, self.machine, inputs, reward_source=self._reward_source)
        self.plan = plan_for_run(cfg, self.run_spec, planned)
        log.info("plan (%s, %s): %s", self.plan.strategy, self.plan.machine, plan_summary(self.plan))
        try:
            (self.output_dir / "plan.json").write_text(self.plan.to_json())
        except OSError as err:
            raise WriteError("the run's plan cannot be written", err, self.output_dir / "plan.json") from None
        write_run_record(self.output_dir, self.algorithm, cfg)
        recorder = PhaseRecorder(lambda op: self.progress and self.progress.phase(op))
        if cfg.executor == "ray":
            from ..runtime.ray import RayExecutor

            threads = self.machine.threads_per_slot or 1
            self.executor = RayExecutor(self.plan, self.role_specs(), recorder=recorder, seed=cfg.seed, address=cfg.ray_address,
                                        cpus_per_worker=float(threads) if self.machine.kind == "cpu" else 1.0)
        else:
            self.executor = LocalExecutor(self.plan, self.role_specs(), recorder=recorder)
        if cfg.hang_timeout_s is not None:
            from ..runtime.watchdog import Watchdog

            self.executor.watchdog = Watchdog(cfg.hang_timeout_s, cfg.on_hang, report_path=self.output_dir / "hang.txt",
                                              step=lambda: self.step)
        if cfg.partial_rollouts != "finish":
            from ..runtime.partial import PartialRollouts

            self.executor.partial_rollouts = PartialRollouts(cfg.partial_rollouts, cfg.partial_segment_tokens)
        if self.plan.staleness:
            self.executor.set_weight_sync(cfg.async_weight_sync)
        self.algorithm_state = AlgorithmState(self.definition.state, self.graph)
        self.loader = PromptLoader(PromptDataset(self.train_rows), cfg.rollout_batch_size, seed=cfg.seed)
        self.prompts = PromptQueue(self.loader, self._prompt_batch)
        self._resume()
        self.prompt_log = PromptLog(self.output_dir, self.step if self.resumed_from else None)
        self.value_hashes = ValueHashes(self.output_dir / "hashes.jsonl", resume_step=self.step if self.resumed_from else None,
                                        plan=self.plan) if cfg.record_hashes else None
        if self._trackers is None:
            self._trackers = build_trackers(cfg, self.output_dir, self.step if self.resumed_from else None)

    def role_specs(self) -> dict[str, RoleSpec]:
        """How to build each role's engines from the config (:func:`.role_specs.role_specs`)."""
        return role_specs(self.config, self.run_spec, self.plan, self.inputs, reward_source=self._reward_source)

    # -- the loop --------------------------------------------------------------------------
    def train(self) -> list[dict[str, float]]:
        """Run up to ``max_steps`` steps; returns the metrics of the steps run (also sent to the trackers). On a run
        that is already finished (resumed at ``max_steps``: nothing left to run) it returns the run's history as its
        ``metrics.jsonl`` holds it.

        The output folder is locked for the duration (:mod:`.run_lock`: a second run on it is an
        OutputDirError). A first SIGINT/SIGTERM ends the run after the current step, with a checkpoint
        unless ``save_on_interrupt=False``; ``stop_signal`` then names it (see :mod:`.interrupt`).
        """
        from .interrupt import StopRequest
        from .run_lock import remove_stale_temp

        with StopRequest() as stop, self._lock:
            remove_stale_temp(self.output_dir)
            self.stop_signal = None
            if self.executor is None:
                stop.at_once = True  # start-up: no step to finish, nothing to save; a Ctrl-C stops it now
                try:
                    if self.config.check_determinism and self.determinism is None:
                        self.determinism = check_determinism(self.config, self.definition, reward=self._reward_source)
                    self.prepare()
                finally:
                    stop.at_once = False
            if self.step >= self.config.max_steps and not self.history:  # a finished run: its recorded steps
                self.history = recorded_history(self.output_dir / "metrics.jsonl", self.step)
            try:
                self._loop(stop)
            except Exception:
                if stop.forced:  # a second signal broke what was running (e.g. a checkpoint write): a stop, not its error
                    raise KeyboardInterrupt("a second signal: stopping at once") from None
                raise
        return self.history

    def _loop(self, stop) -> None:
        cfg = self.config
        self.progress = StepProgress(cfg.max_steps, self.step, enabled=cfg.progress_bar)
        deadline = time.monotonic() + cfg.max_time_s if cfg.max_time_s else float("inf")
        self._saved_step = self.step  # 0, or the step of the checkpoint resumed from
        try:
            if self.step == 0 and not stop.requested:
                self._log(self._validate_with_progress(), 0)
            first, restarts, lost = self.step, 0, None
            while self.step < cfg.max_steps and not stop.requested:
                self.step += 1
                try:
                    metrics = self.train_step(self._next_rows())
                    ended = self._end_of_step(metrics, deadline, stop)  # a worker may die in its checkpoint write too
                except WorkerLostError as err:
                    if stop.requested:  # the signal reached the workers too: the step is abandoned
                        self.step, lost = self.step - 1, err
                        break
                    restarts = self.recover(err, restarts)
                    del self.history[max(0, self.step - first):]
                    continue
                if ended:
                    break
            if stop.requested:
                self._stop_on_signal(stop, lost)
        finally:
            self.progress.close()
            self.progress = None
            for tracker in self._trackers or ():
                tracker.close()
            self._trackers = []

    def _end_of_step(self, metrics: dict[str, float], deadline: float, stop) -> bool:
        """Validate (when due), log and checkpoint (when due) the step just run; True when it ends the run."""
        cfg = self.config
        stop.check()
        self.out_of_time = time.monotonic() >= deadline and self.step < cfg.max_steps
        last = self.step == cfg.max_steps or self.out_of_time
        if not stop.requested and (last or (cfg.eval_freq and self.step % cfg.eval_freq == 0)):
            metrics.update(self._validate_with_progress())
            target = cfg.stop_at_val_score
            self.target_reached = target is not None and metrics["val/score/greedy"] >= target
            last = last or self.target_reached
        self._nan_streak = nan_streak(metrics, self.step, self._nan_streak, cfg.max_nan_steps)
        self.history.append(metrics)
        self.progress.step_done(metrics)
        self._log(metrics, self.step)
        if cfg.save_freq and (last or self.step % cfg.save_freq == 0):
            stop.check()
            self.save_checkpoint()
        if self.target_reached:
            log.warning("val/score/greedy=%.3f reached stop_at_val_score=%g: stopping after step %d",
                        metrics["val/score/greedy"], cfg.stop_at_val_score, self.step)
        elif self.out_of_time:
            log.warning("max_time_s=%g reached: stopping after step %d of %d (resume='auto' continues)",
                        cfg.max_time_s, self.step, cfg.max_steps)
        return last

    def _stop_on_signal(self, stop, lost: WorkerLostError | None) -> None:
        """The run was asked to stop: checkpoint the last finished step (unless saved or save_on_interrupt=False)."""
        self.stop_signal = stop.name
        stop.check()
        if lost is not None:  # no engines left to save from
            log.warning("%s: the workers were stopped too (%s); step %d abandoned without a checkpoint, resume='auto' "
                        "continues from the newest one", stop.name, lost, self.step + 1)
            return
        if self.config.save_on_interrupt and self.step != self._saved_step:
            self.save_checkpoint()
        if self.step == self._saved_step and self.step > 0:
            where = f"; resume='auto' continues from the checkpoint of step {self.step}"
        elif self.step > self._saved_step:
            where = " without a checkpoint of it (save_on_interrupt=False)"
        else:
            where = ""
        log.warning("%s: stopped after step %d of %d%s", stop.name, self.step, self.config.max_steps, where)

    def recover(self, err: WorkerLostError, used: int) -> int:
        """After ``err`` (the ``used``-th restart so far): a fresh worker group with the newest checkpoint loaded;
        returns the restarts used (re-raises ``err`` past ``max_restarts``). :meth:`train` calls it."""
        from .resume import resume_newest

        if used >= self.config.max_restarts:
            raise err
        log.warning("%s -- restart %d of %d: new workers, resuming from the newest checkpoint", err, used + 1,
                    self.config.max_restarts)
        self.executor.restart()
        self.prompts.clear()  # their generations died with the workers; the checkpoint's loader position draws them again
        self._restore(resume_newest(self._checkpoint_scope()))
        for tracker in [*(self._trackers or ()), *filter(None, [self.value_hashes, self.prompt_log])]:  # the steps after the checkpoint
            if hasattr(tracker, "rewind"):                                            # are run again: log each once
                tracker.rewind(self.step)
        return used + 1

    def _next_rows(self) -> list[dict]:
        """The next step's prompt rows: the ones whose generation already started (staleness k), else the loader's."""
        return self.prompts.next().rows

    def _prompt_batch(self, rows: list[dict]):
        from ..data import make_prompt_batch

        current = self.prompts.current if self.prompts is not None else None
        if current is not None and current.rows is rows:
            return current.batch  # the very batch the executor is generating for
        return make_prompt_batch(rows, self.tokenizer, max_prompt_length=self.config.max_prompt_length,
                                 apply_chat_template=self.config.apply_chat_template, cache=self._prompt_tokens)

    def train_step(self, rows: list[dict]) -> dict[str, float]:
        """One iteration of the plan on ``rows``; with a staleness-k plan, the following steps' generations (up to k,
        drawn from the loader in order, none past ``max_steps``) are started."""
        from ..runtime.policy_version import staleness_metrics

        prompts = self._prompt_batch(rows)
        current = self.prompts.start_step(rows)
        ahead: dict = {}
        if self.plan.staleness:  # the following steps' prompts, none past max_steps
            following = self.prompts.fill(min(self.plan.staleness, self.config.max_steps - self.step))
            ahead = {"next_inputs": [{"prompts": drawn.batch} for drawn in following]}
        if self.prompt_log is not None and current is not None:
            self.prompt_log.record(self.step, current.indices)
        start, first_span = time.perf_counter(), len(self.executor.recorder.spans)
        if self.graph.resample:  # dynamic sampling: each further round draws the loader's next prompts
            ahead["refill"] = lambda round_: {"prompts": self._prompt_batch(self.loader.next_batch())}
        result = self.executor.run_iteration({"prompts": prompts}, params=self.algorithm_state.node_params(), **ahead)
        elapsed = time.perf_counter() - start
        role_kinds = {r.name: r.kind for r in self.graph.roles}
        ops = {n.name: n.op for n in self.graph.nodes}
        metrics = dict(result.metrics)
        metrics.update(timing_metrics(self.executor.recorder.spans[first_span:], role_kinds, ops))
        if self.calibration_check is None:
            from .calibration_check import check_calibration

            self.calibration_check = check_calibration(self.plan, self.executor.recorder.spans, self.run_spec.profiles,
                                                       self.config.calibrate_drift)
            if self.calibration_check is not None:
                metrics["perf/measured_over_predicted"] = self.calibration_check.ratio  # timing-derived, as perf/throughput
        tokens = sum(float(b["response_mask"].sum()) for n, b in result.env.items()
                     if n != "prompts" and "response_mask" in b.tensors.keys())
        metrics["timing_s/step"] = elapsed
        metrics["perf/throughput"] = tokens / max(elapsed, 1e-9)
        metrics.update(staleness_metrics(result.env, trainer_version=self.step - 1))  # steps done before this one
        if self.config.trajectory_log_samples:
            log_trajectories(self.output_dir, self.step, result.env, self.config.trajectory_log_samples)
        if self.value_hashes is not None:
            self.value_hashes.record(self.step, result.env)
        metrics.update(self.algorithm_state.advance(metrics))
        return metrics

    # -- what the workers hold, through plans -------------------------------------------------------
    def describe(self, role: str) -> list[dict]:
        """What ``role``'s engines are, as its workers report them (``Worker.describe``: engine types, train and
        sampling settings, trainable parameters, reward function), one report per slot holding them: the role's
        pool first, then its generation pool."""
        from ..compiler.control import control_plan

        plan = control_plan(self.plan, "describe", [role])
        results = self.executor.run_plan(plan).results
        return [report for op in plan.ops for report in results[op.name]]

    def policy_model(self, role: str | None = None):
        """The trained model of policy ``role`` (default: the first policy) as a transformers model on this process:
        its worker's weights (gathered on a sharded pool), LoRA adapters merged, in eval mode (an ``export`` plan)."""
        from ..compiler.control import control_plan
        from .export import model_from_export

        role = role or next(r.name for r in self.graph.roles if r.kind == "policy")
        result = self.executor.run_plan(control_plan(self.plan, "export", [role])).results[f"{role}.export"][0]
        return model_from_export(result, what=f"role {role!r}")

    def train_state(self, role: str) -> dict:
        """The whole train state of ``role`` (model, optimizer, schedule; full tensors, gathered on a sharded pool),
        as its workers hold it now (an ``export`` plan with the optimizer)."""
        from ..compiler.control import control_plan

        plan = control_plan(self.plan, "export", [role], items=("optimizer",))
        return self.executor.run_plan(plan).results[f"{role}.export"][0]["train_state"]

    # -- validation ----------------------------------------------------------------------------
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Greedy score (accuracy for 0/1 rewards) and mean@k on the validation prompts.

        Runs the validation plan (:func:`hybridflow.compiler.validation.validation_plan`: the policy's greedy
        and sampled generations, scored, on the training plan's pools, after a weight sync) through the executor.
        """
        from ..compiler.validation import validation_plan
        from ..data import make_prompt_batch

        cfg = self.config
        if self._validation_plan is None:
            self._validation_plan = validation_plan(self.plan, samples=cfg.val_samples, seed=cfg.seed + VAL_SEED_OFFSET)
        prompts = make_prompt_batch(self.val_rows, self.tokenizer, max_prompt_length=cfg.max_prompt_length,
                                    apply_chat_template=cfg.apply_chat_template)
        env = self.executor.run_plan(self._validation_plan, {"prompts": prompts}).env
        greedy, sampled = (n.name for n in self._validation_plan.graph.nodes if n.kind == "score")
        # means in float64: 90 of 100 in float32 is 0.89999998, which a stop_at_val_score=0.9 would not reach
        return {"val/score/greedy": float(env[greedy]["scores"].double().mean()),
                f"val/score/mean@{cfg.val_samples}": float(env[sampled]["scores"].double().mean())}

    def _validate_with_progress(self) -> dict[str, float]:
        if self.progress is not None:
            self.progress.phase("validate")
        self.validations[self.step] = self.validate()
        return self.validations[self.step]

    def _log(self, metrics: dict[str, float], step: int) -> None:
        for tracker in self._trackers or ():
            tracker.log(metrics, step)

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Write a checkpoint of the current step (see :mod:`.checkpoint`); returns its folder."""
        from .resume import save_run

        if self.progress is not None:
            self.progress.phase("save checkpoint")
        state = {"loader": self.prompts.loader_state(), "nan_streak": self._nan_streak,
                 "algorithm_state": self.algorithm_state.state_dict()}
        self.last_checkpoint = save_run(self._checkpoint_scope(), self.step, state)
        self._saved_step = self.step
        return self.last_checkpoint

    def _checkpoint_scope(self):
        from .resume import CheckpointScope

        return CheckpointScope(self.config, self.algorithm, self.executor, self.plan, self.inputs, self.output_dir)

    def _resume(self) -> None:
        from .resume import resume_run

        found = resume_run(self._checkpoint_scope())
        if found is not None:
            self._restore(found)

    def _restore(self, found) -> None:
        """Continue from checkpoint ``found`` (its engines loaded): the data position, step and algorithm state."""
        self.loader.load_state_dict(found.state["loader"])
        self.step = found.step
        self._nan_streak = int(found.state.get("nan_streak", 0))
        self.algorithm_state.load_state_dict(found.state.get("algorithm_state", {}))
        self.resumed_from = found.path
        log.warning("resumed from %s (step %d of %d)", found.path, found.step, self.config.max_steps)


class PPOTrainer(Trainer):
    """PPO with a critic, GAE, and a KL penalty to the reference model (Ouyang et al. 2022)."""

    algorithm = "ppo"


class GRPOTrainer(Trainer):
    """GRPO (Shao et al. 2024): n samples per prompt, group-normalised advantages, no critic."""

    algorithm = "grpo"


class RLOOTrainer(Trainer):
    """RLOO (Ahmadian et al. 2024): leave-one-out baseline over n samples per prompt."""

    algorithm = "rloo"


class ReinforcePPTrainer(Trainer):
    """REINFORCE++ (Hu 2025): KL-shaped token rewards, batch-whitened returns, no critic."""

    algorithm = "reinforce_pp"


class ReMaxTrainer(Trainer):
    """ReMax (Li et al. 2023): the greedy response's reward as the baseline."""

    algorithm = "remax"


class SafeRLHFTrainer(Trainer):
    """Safe-RLHF (Dai et al. 2023): PPO on reward minus lambda times cost, lambda adapted to keep the cost under cost_limit."""

    algorithm = "safe_rlhf"
