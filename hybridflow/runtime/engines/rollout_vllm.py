"""The rollout engine on vLLM (registered as ``vllm``): the only module that imports vLLM.

Built from the policy's module (:meth:`VLLMRolloutEngine.from_module`): its
weights and config are written as a transformers folder in RAM-backed
storage (``/dev/shm``) and ``vllm.LLM`` starts from it *in this process*
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core runs here, so new
weights are handed over as tensors, not files). In a process that is part of
a ``torch.distributed`` world (a Ray slot worker) vLLM's worker, which would
otherwise join that world and wait for its other ranks, runs in a spawned
process of its own (:func:`worker_in_own_process`); the engine core stays
here and tensors reach the worker pickled through vLLM's shared-memory queue.
A script that starts vLLM after ``init_process_group`` therefore needs the
``if __name__ == "__main__":`` guard of Python's spawn start method. vLLM gets token ids, never
text (``skip_tokenizer_init``); the ``responses`` column is decoded with the
role's tokenizer, as in :mod:`.rollout_hf`.

Batch contract (:mod:`.protocols`): each prompt of the batch is sent ``n``
times as its own request (left padding stripped), so the ``n`` samples of a
prompt sit in consecutive rows and each has its own seed. Stop tokens are
the EOS ids and the pad id (a sampled pad ends a response like EOS, as in
:mod:`.decode`); the stop token is kept and masked in. Log-probs: vLLM runs
with ``logprobs_mode="raw_logprobs"`` (``log_softmax(logits)``, before
temperature and truncation) and reports the sampled token's; at ``T = 1`` that
*is* the contract's ``log_softmax(logits / T)``. At ``T != 1`` it asks for the
whole vocabulary's raw log-probs and rescales, ``log_softmax(raw / T)`` (exact,
since ``raw = logits - logsumexp(logits)``; costs a vocabulary-sized dict per
token, fine for small vocabularies).

Seeds: with ``sampling.seed = s`` request ``j`` of the ``k``-th call with that
seed samples with vLLM seed ``mix(s, k, j)`` — reproducible, fresh each call, and
continued exactly after :meth:`set_rng_state` (the state is ``{s: k}``).

Weights (:meth:`update_weights`): buckets of one sync are held (references,
no copy) until every tensor of the model has arrived, then loaded in one
``reload_weights`` call on the worker (vLLM re-runs its post-load processing,
e.g. the CPU backend's repacking of linear weights, which a bare
``load_weights`` skips). ``weight_transfer="shm"`` instead writes them as
safetensors to the staging folder and reloads from the path (the path a
multi-process vLLM needs).

LoRA: a policy with LoRA adapters (:mod:`.lora`) starts vLLM on its base weights with
``enable_lora`` (``max_lora_rank``: the smallest rank vLLM accepts that holds the adapters'),
and a sync sends the adapters only: once all have arrived they are written as a peft adapter
folder in the staging folder and every later generation runs with a new ``LoRARequest`` (a
new int id per sync; the previous adapter is removed from vLLM and its folder deleted).
Before the first sync it generates with the base model, which is where LoRA starts.

Side effects of starting vLLM that this module undoes: vLLM seeds the global
torch/numpy/python RNGs (they are restored, so the run's random stream does not
move) and on CPU replaces ``torch.set_num_threads`` with a no-op (restored).
vLLM's CPU thread binding is turned off (``VLLM_CPU_OMP_THREADS_BIND=nobind``)
unless set, since this process also trains.

GPU (CUDA vLLM, not runnable on the CPU machine this was built on; see
docs/rollout_engines.md): the same code; ``sleep_mode`` enables vLLM's sleep
mode so :meth:`sleep`/:meth:`wake` free and restore weights and KV cache around
training (the hybrid engine), and ``direct`` transfer hands CUDA tensors of the
train engine to the in-process worker on the same device (no IPC, no NCCL).
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch

from hybridflow.errors import ConfigError, ExecutionError

from ...batch import Batch
from .agent_loop import AgentParams, EnvHost, agent_rollout
from .lora import adapter_config, adapter_names, base_state, is_lora, peft_adapter_files
from .registry import VLLMOptions
from .sampling import SamplingParams
from .segments import check_resumable, stamp_versions
from .vllm_segments import VLLMSegments
from .text import decode_responses

__all__ = ["VLLMRolloutEngine", "vllm_seed", "worker_in_own_process"]

_MASK64 = (1 << 64) - 1


def vllm_seed(seed: int, call: int, request: int) -> int:
    """A 63-bit seed for request ``request`` of call ``call`` of stream ``seed`` (splitmix64 of the three)."""
    x = (seed * 0x9E3779B97F4A7C15 + call * 0xBF58476D1CE4E5B9 + request * 0x94D049BB133111EB) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1


def _vllm():
    try:
        import vllm
    except ImportError as err:
        raise ConfigError(f"rollout_engine 'vllm' needs vLLM, which this Python cannot import ({err}); "
                          "create its environment with `make vllm-env` and run with .venv-vllm/bin/python "
                          "(see docs/rollout_engines.md), or use rollout_engine: hf") from None
    return vllm


def _special_ids(module: torch.nn.Module, tokenizer, name: str) -> tuple[int, ...]:
    for source in (getattr(module, "generation_config", None), getattr(module, "config", None), tokenizer):
        value = getattr(source, name, None)
        if value is not None:
            return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)
    return ()


def _staging_dir() -> Path:
    root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="hybridflow-vllm-", dir=root))


def _stage(module: torch.nn.Module, folder: Path) -> None:
    """Write ``module`` as a transformers folder vLLM can load: config, generation config, one safetensors file.

    Not ``save_pretrained``: with ``torch.distributed`` initialised (a Ray slot worker) it writes on rank 0 only.
    Tensors sharing storage (tied embeddings) are written once, under their first name.
    """
    from safetensors.torch import save_file

    module.config.to_json_file(str(folder / "config.json"))
    if getattr(module, "generation_config", None) is not None:
        module.generation_config.to_json_file(str(folder / "generation_config.json"))
    tensors, seen = {}, set()
    for name, tensor in base_state(module).items():  # a LoRA module: its base weights under the plain names
        key = (tensor.data_ptr(), tensor.shape)
        if key not in seen:
            seen.add(key)
            tensors[name] = tensor.detach().contiguous().cpu()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


class _GlobalStateGuard:
    """Keeps the global RNGs and ``torch.set_num_threads`` as they were across vLLM's start-up."""

    def __enter__(self):
        self.torch, self.numpy, self.python = torch.get_rng_state(), np.random.get_state(), random.getstate()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self.set_num_threads, self.threads = torch.set_num_threads, torch.get_num_threads()
        return self

    def __exit__(self, *exc):
        torch.set_num_threads = self.set_num_threads
        torch.set_num_threads(self.threads)
        torch.set_rng_state(self.torch)
        np.random.set_state(self.numpy)
        random.setstate(self.python)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        return False


def worker_in_own_process() -> bool:
    """Whether vLLM's worker must run in a process of its own: when this process is in a ``torch.distributed``
    world (a Ray slot worker).

    vLLM's worker joins the world it finds initialised and creates its groups over *every* rank of it
    (``init_world_group`` -> ``torch.distributed.new_group``, which each rank of the world must call), so in a
    slot whose peers never call it, start-up waits for them forever. A spawned process has no world: vLLM makes
    its own, of one rank.
    """
    return torch.distributed.is_available() and torch.distributed.is_initialized()


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``max_lora_rank`` (``vllm.config.lora.MaxLoRARanks``)."""


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds adapters of ``rank``; ConfigError above its largest."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ConfigError(f"lora_rank {rank} exceeds vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}; lower it or "
                      "use rollout_engine: hf")


def _start_llm(folder: Path, options: VLLMOptions, device: str, max_len: int, own_process: bool,
               lora_rank: int | None = None):
    """``vllm.LLM`` on ``folder``: the engine core in this process, its worker here too or (``own_process``) in a
    spawned process (vLLM's ``mp`` executor; :func:`worker_in_own_process`); ``lora_rank``: with LoRA enabled."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if own_process:  # a forked worker would inherit this process's world (and its sockets)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if not device.startswith("cuda"):
        if options.sleep_mode:
            raise ConfigError("rollout_engine_options.sleep_mode: vLLM refuses sleep mode on CPU; leave it off there")
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(options.kv_cache_gib)
    vllm = _vllm()
    kwargs = dict(model=str(folder), skip_tokenizer_init=True, dtype=options.dtype, max_model_len=max_len,
                  tensor_parallel_size=options.tensor_parallel_size, enforce_eager=options.enforce_eager, seed=0,
                  max_num_seqs=options.max_num_seqs, logprobs_mode="raw_logprobs", max_logprobs=-1,
                  enable_prefix_caching=True)
    if own_process:
        kwargs.update(distributed_executor_backend="mp")
    if lora_rank is not None:
        kwargs.update(enable_lora=True, max_lora_rank=vllm_lora_rank(lora_rank), max_loras=1)
    if device.startswith("cuda"):
        kwargs.update(gpu_memory_utilization=options.gpu_memory_utilization, enable_sleep_mode=options.sleep_mode)
    with _GlobalStateGuard():
        return vllm.LLM(**kwargs)


class VLLMRolloutEngine(VLLMSegments):
    """Generates with an in-process ``vllm.LLM`` and takes new weights in place (module docstring).

    Use :meth:`from_module`; the constructor takes a started ``llm``.
    """

    def __init__(self, llm, *, folder: Path, shapes: Mapping[str, tuple[int, ...]], tokenizer=None,
                 sampling: SamplingParams | None = None, eos_token_ids: Sequence[int] = (), pad_token_id: int = 0,
                 options: VLLMOptions | None = None, max_len: int = 512, lora: Mapping | None = None):
        self.llm = llm
        self.folder = folder
        self.shapes = dict(shapes)
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingParams()
        self.eos_token_ids = tuple(eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.options = options or VLLMOptions()
        self.max_len = max_len
        self._calls: dict[int, int] = {}
        self._pending: dict[str, torch.Tensor] = {}
        self.lora_config = dict(lora) if lora is not None else None
        """The peft adapter config of a LoRA policy (``shapes`` are then the adapters'); None: full weights."""
        self._lora_request = None
        self._lora_ids = 0
        self.policy_version = 0
        """Weight syncs applied (the worker counts one per completed sync); stamped on each token."""
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(folder), True)

    @classmethod
    def from_module(cls, module: torch.nn.Module, *, tokenizer=None, sampling: SamplingParams | None = None,
                    device: str = "cpu", options: VLLMOptions | None = None) -> "VLLMRolloutEngine":
        """Stage ``module`` (a transformers causal LM) as a folder in /dev/shm and start vLLM on it."""
        options = options or VLLMOptions()
        if not hasattr(module, "save_pretrained"):
            raise ConfigError(f"rollout_engine 'vllm' needs a transformers model (with save_pretrained); got "
                              f"{type(module).__name__}")
        folder = _staging_dir()
        try:
            _stage(module, folder)
            config = module.config
            max_len = options.max_model_len or int(getattr(config, "max_position_embeddings", 2048))
            lora = adapter_config(module) if is_lora(module) else None
            llm = _start_llm(folder, options, device, max_len, worker_in_own_process(),
                             lora_rank=lora["r"] if lora else None)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if options.weight_transfer == "direct" and lora is None:
            # vLLM has read the folder and 'direct' never reads it again: gone now, it cannot outlive a process
            # killed without clean-up (a Ray slot's, by ray.kill); 'shm' reloads from it, so it stays until the end
            shutil.rmtree(folder, ignore_errors=True)
        eos = _special_ids(module, tokenizer, "eos_token_id")
        pad = (_special_ids(module, tokenizer, "pad_token_id") or eos or (0,))[0]
        synced = adapter_names(module)  # what a sync sends: the adapters of a LoRA module, else everything
        shapes = {name: tuple(t.shape) for name, t in module.state_dict().items() if not synced or name in synced}
        return cls(llm, folder=folder, shapes=shapes, tokenizer=tokenizer, sampling=sampling, eos_token_ids=eos,
                   pad_token_id=pad, options=options, max_len=max_len, lora=lora)

    # -- generation ----------------------------------------------------------------------------
    def _request_params(self, params: SamplingParams, seed: int | None, extra_stops: Sequence[int] = ()):
        vllm = _vllm()
        stops = sorted({*self.eos_token_ids, self.pad_token_id}) if params.stop_at_eos else []
        stops = sorted({*stops, *extra_stops})
        return vllm.SamplingParams(
            n=1, temperature=0.0 if params.greedy else params.temperature, top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1, max_tokens=params.max_new_tokens, seed=seed,
            stop_token_ids=stops, ignore_eos=not params.stop_at_eos, logprobs=0 if params.temperature == 1.0 else -1,
            detokenize=False, skip_special_tokens=False)

    def generate(self, batch: Batch, sampling: SamplingParams | None = None, *, segment_tokens: int | None = None,
                 resume: bool = False) -> Batch:
        """Responses for every prompt of ``batch`` (``n`` each), in the batch contract of :mod:`.protocols`.

        Partial rollouts (:mod:`.segments`): ``segment_tokens`` caps each request's ``max_tokens``; ``resume``
        sends each unfinished row again as one request whose prompt is its prompt and the tokens kept so far
        (vLLM recomputes their KV cache, with the weights it holds now: slime's abort-and-resubmit)."""
        params = sampling or self.sampling
        if segment_tokens is not None and segment_tokens < 1:
            raise ExecutionError(f"generate: segment_tokens must be at least 1 (or None: no cut), got {segment_tokens}")
        if resume:
            check_resumable(batch)
        elif "prompt_ids" not in batch or "prompt_mask" not in batch:
            raise ExecutionError(f"generate needs prompt_ids and prompt_mask in the batch; it has {batch.keys()}")
        self._flush_incomplete()
        prompts = _unpadded(batch["prompt_ids"], batch["prompt_mask"])
        longest = max(len(p) for p in prompts) + params.max_new_tokens
        if longest > self.max_len:
            raise ExecutionError(f"vllm rollout: prompt + response of {longest} tokens exceeds max_model_len "
                                 f"{self.max_len}; raise rollout_engine_options.max_model_len")
        if resume:
            return self._continue(batch, prompts, params, segment_tokens)
        budget = params.max_new_tokens if segment_tokens is None else min(segment_tokens, params.max_new_tokens)
        call = self._next_call(params.seed)
        requests, sampling_list = [], []
        for i, ids in enumerate(prompts):
            for j in range(params.n):
                k = i * params.n + j
                requests.append({"prompt_token_ids": ids})
                sampling_list.append(self._seeded_request(params, budget, call, k))
        outputs = self.llm.generate(requests, sampling_list, use_tqdm=False, lora_request=self._lora_request)
        fields = self._fields([o.outputs[0] for o in outputs], params)
        fields["policy_version"] = stamp_versions(fields["response_mask"], self.policy_version)
        if segment_tokens is not None:
            decoded = torch.full((len(outputs),), budget, dtype=torch.int64)
            fields.update(decoded_steps=decoded, rollout_finished=self._ended(fields, decoded, params))
        if self.tokenizer is not None:
            fields["responses"] = decode_responses(self.tokenizer, fields["response_ids"], fields["response_mask"],
                                                   self.eos_token_ids)
        repeated = batch.repeat_interleave(params.n) if params.n > 1 or "group_index" not in batch else batch
        return repeated.with_fields(**fields)

    def _next_call(self, seed: int | None) -> int | None:
        """The number of this call of the ``seed`` stream (its requests' seeds derive from it); None without a seed."""
        if seed is None:
            return None
        call = self._calls.get(seed, 0)
        self._calls[seed] = call + 1
        return call

    def _seeded_request(self, params: SamplingParams, budget: int, call: int | None, index: int):
        """vLLM's sampling params of request ``index`` of call ``call`` (None: unseeded), at most ``budget`` tokens."""
        return self._request_params(params.model_copy(update={"max_new_tokens": budget}),
                                    None if call is None else vllm_seed(params.seed, call, index))

    def generate_agentic(self, batch: Batch, sampling: SamplingParams | None, agent: AgentParams,
                         envs: EnvHost | None = None) -> Batch:
        """Multi-turn trajectories against ``agent.env`` (:mod:`.agent_loop`), ``n`` per prompt: each turn is one
        ``LLM.generate`` call over the samples that are ready, given their token ids (never text); the environments
        where ``envs`` puts them (None: in this process)."""
        params = sampling or self.sampling
        self._flush_incomplete()
        longest = max(len(p) for p in _unpadded(batch["prompt_ids"], batch["prompt_mask"])) + agent.max_total_tokens
        if longest > self.max_len:
            raise ExecutionError(f"vllm rollout: prompt + trajectory of {longest} tokens exceeds max_model_len "
                                 f"{self.max_len}; raise rollout_engine_options.max_model_len or lower max_total_tokens")

        def turns(contexts: list[list[int]], budget: int, stop_ids: tuple[int, ...]) -> list[tuple[list[int], list[float]]]:
            turn = params.model_copy(update={"n": 1, "max_new_tokens": budget})
            call = self._next_call(params.seed)
            requests = [{"prompt_token_ids": list(c)} for c in contexts]
            sampling_list = [self._request_params(turn, None if call is None else vllm_seed(params.seed, call, k), stop_ids)
                             for k in range(len(contexts))]
            outputs = self.llm.generate(requests, sampling_list, use_tqdm=False, lora_request=self._lora_request)
            out = []
            for completion in (o.outputs[0] for o in outputs):
                tokens = list(completion.token_ids)[:budget]
                out.append((tokens, [_token_log_prob(step, token, params.temperature)
                                     for step, token in zip(completion.logprobs, tokens)]))
            return out

        return agent_rollout(turns, self.tokenizer, batch, params, agent, eos_token_ids=self.eos_token_ids,
                             pad_token_id=self.pad_token_id, envs=envs)

    def _fields(self, completions: Sequence[Any], params: SamplingParams) -> dict[str, torch.Tensor]:
        """``response_ids``, ``response_mask``, ``rollout_log_probs`` of ``(len(completions), max_new_tokens)``."""
        b, steps = len(completions), params.max_new_tokens
        ids = torch.full((b, steps), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((b, steps), dtype=torch.float32)
        log_probs = torch.zeros((b, steps), dtype=torch.float32)
        for row, completion in enumerate(completions):
            tokens = list(completion.token_ids)[:steps]
            ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            mask[row, :len(tokens)] = 1.0
            log_probs[row, :len(tokens)] = torch.tensor(
                [_token_log_prob(step, token, params.temperature) for step, token in zip(completion.logprobs, tokens)],
                dtype=torch.float32)
        return {"response_ids": ids, "response_mask": mask, "rollout_log_probs": log_probs}

    # -- weights ---------------------------------------------------------------------------------
    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.shapes)

    def shares_weights_with(self, train: Any) -> bool:
        return False  # vLLM always holds its own copy

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Take a bucket; once every tensor of the model has arrived, load them all (module docstring)."""
        taken = 0
        for name, tensor in named_tensors:
            shape = self.shapes.get(name)
            if shape is None:
                raise ExecutionError(f"weight sync: the vllm rollout model has no tensor {name!r} "
                                     f"(it has e.g. {list(self.shapes)[:3]}); train and rollout models must share names")
            if tuple(tensor.shape) != shape:
                raise ExecutionError(f"weight sync: {name!r} has shape {tuple(tensor.shape)} but the vllm rollout "
                                     f"model expects {shape}")
            self._pending[name] = tensor.detach()
            taken += 1
        if len(self._pending) == len(self.shapes):
            self._load_pending()
        return taken

    def _load_pending(self) -> None:
        weights, self._pending = self._pending, {}
        if self.lora_config is not None:
            self._load_adapter(weights)
        elif self.options.weight_transfer == "shm":  # tensors do not cross vLLM's process boundary
            from safetensors.torch import save_file

            self.folder.mkdir(parents=True, exist_ok=True)  # removed after start-up when the engine began with 'direct'
            for old in self.folder.glob("*.safetensors"):
                old.unlink()
            save_file({n: t.contiguous().cpu() for n, t in weights.items()}, str(self.folder / "model.safetensors"))
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self.folder)})
        else:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})

    def _load_adapter(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Write the adapters as a peft folder and generate with them from now on (a new LoRARequest id)."""
        from vllm.lora.request import LoRARequest

        previous = self._lora_request
        self._lora_ids += 1
        path = peft_adapter_files(self.lora_config, weights, self.folder / f"adapter-{self._lora_ids}")
        self._lora_request = LoRARequest(f"policy-{self._lora_ids}", self._lora_ids, str(path))
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def _flush_incomplete(self) -> None:
        if self._pending:
            missing = [n for n in self.shapes if n not in self._pending]
            raise ExecutionError(f"weight sync into vllm stopped after {len(self._pending)} of {len(self.shapes)} "
                                 f"tensors (missing e.g. {missing[:3]}); a sync must send the whole model")

    # -- randomness, memory -------------------------------------------------------------------------
    def rng_state(self) -> dict[str, Any]:
        """``{"calls": {seed: calls made}}``: the next call with a seed continues from it."""
        return {"calls": {str(seed): count for seed, count in self._calls.items()}}

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        self._calls.update({int(seed): int(count) for seed, count in state.get("calls", {}).items()})

    def sleep(self) -> None:
        """CUDA with ``sleep_mode``: free weights and KV cache (level 1 keeps the weights in host memory); else nothing."""
        if self.options.sleep_mode:
            self.llm.sleep(level=1)

    def wake(self) -> None:
        if self.options.sleep_mode:
            self.llm.wake_up()


def _unpadded(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """Each row's prompt tokens without its (left) padding: ``(b, P)`` -> b lists."""
    return [row[mask.bool()].tolist() for row, mask in zip(prompt_ids, prompt_mask)]


def _token_log_prob(step: Mapping[int, Any], token: int, temperature: float) -> float:
    """``log_softmax(logits / T)[token]`` from vLLM's raw log-probs of one step (module docstring)."""
    if temperature == 1.0:
        return float(step[token].logprob)
    ids = list(step)
    raw = torch.tensor([step[i].logprob for i in ids], dtype=torch.float64)
    scaled = torch.log_softmax(raw / temperature, dim=0)
    return float(scaled[ids.index(token)])
