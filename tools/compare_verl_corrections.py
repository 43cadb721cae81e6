"""Compare hybridflow's off-policy corrections with verl's on random inputs: max abs difference per correction.

    .venv/bin/python tools/compare_verl_corrections.py --verl /path/with/verl/package [--deps DIR] [--seeds 20]

``--verl`` is a directory holding verl's ``verl`` package (a checkout, or a snapshot extracted with
``git --git-dir=... archive HEAD verl | tar -x -C DIR``); ``--deps`` is an extra ``sys.path`` entry for
the packages verl's modules import beyond torch (tensordict, omegaconf, codetiming, pyvers; e.g.
``pip install --target DIR --no-deps tensordict omegaconf antlr4-python3-runtime==4.9.3 codetiming pyvers``).
Nothing of verl is copied here: its functions are imported and called.

What is compared (verl 0.8.0.dev names; ``log r = old_log_probs - rollout_log_probs``):

- IS weights: ``compute_rollout_correction_weights`` (token / sequence, with and without batch
  normalisation) against ``truncated_is_weight``, ``sequence_is_weight`` and ``normalize_is_weight``;
- rejection: ``compute_rollout_rejection_mask`` for each of its 11 criteria and for a chain of two,
  against ``kl_rejection_mask`` and ``chained_rejection_mask`` (the share of tokens kept is printed,
  so that a comparison of all-kept or all-rejected masks shows);
- policy losses with ``rollout_is_weights``: verl's ``vanilla`` (its dual clip 3.0 is on by default),
  ``gspo``, ``sapo``, ``gpg``, ``cispo``, ``geo_mean``, ``kl_cov`` and ``compute_policy_loss_reinforce``
  against ``ppo_clip_is``, ``gspo_is``, ``sapo_is``, ``gpg_is``, ``cispo_is``, ``gmpo_is``, ``kl_cov_is``
  and ``reinforce_is``: the loss value and its gradient with respect to ``log_probs``.

verl's ``geo_mean`` averages its sequence losses over every row, empty responses included, where
``gmpo`` averages over the non-empty ones; the comparison drops the empty row for that loss.
verl has no IcePop, no AReaL decoupled weight and no ``dro`` / ``dppo`` / ``clip_cov`` loss with the
same selection (Clip-Cov draws its tokens at random), so those are not compared.
The script prints one line per correction and exits 1 when a difference exceeds ``--tol``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def _import_verl(verl_dir: str, deps: list[str]):
    for path in [verl_dir, *deps]:
        sys.path.insert(0, str(Path(path).resolve()))
    import transformers

    if not hasattr(transformers, "AutoModelForVision2Seq"):
        # verl.utils.model imports this name, which newer transformers renamed; the corrections never use it.
        transformers.AutoModelForVision2Seq = getattr(transformers, "AutoModelForImageTextToText", object)
    import verl.trainer.ppo.core_algos as core
    import verl.trainer.ppo.rollout_corr_helper as rch
    from verl.workers.config import ActorConfig, PolicyLossConfig

    def actor_config(policy_loss: dict | None = None, **kw):
        if policy_loss is not None:
            kw["policy_loss"] = PolicyLossConfig(**policy_loss)
        return ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1, **kw)

    return core, rch, actor_config


def _inputs(seed: int, b: int, r: int, dtype, spread: float):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(b, r, generator=gen) > 0.25).to(dtype)
    mask[:, 0] = 1.0
    mask[-1] = 0.0  # one empty response
    mask[-1, :] = 0.0
    mask[0, -1] = 0.0
    rollout = -torch.rand(b, r, generator=gen, dtype=dtype) * 3 - 0.05
    old = rollout + torch.randn(b, r, generator=gen, dtype=dtype) * spread
    log_probs = old + torch.randn(b, r, generator=gen, dtype=dtype) * 0.1
    adv = torch.randn(b, 1, generator=gen, dtype=dtype).expand(b, r).contiguous()  # one advantage per response
    return old, rollout, log_probs, adv, mask


def _max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    a, b = a.detach().to(torch.float64), b.detach().to(torch.float64)
    if mask is not None:
        a, b = a * mask, b * mask
    return float((a - b).abs().max())


REJECTION = {  # verl option -> (verl threshold, our level, estimator, low, high)
    "token_k1": ("0.6_1.5", "token", "k1", 0.6, 1.5),
    "token_k2": ("0.04", "token", "k2", None, 0.04),
    "token_k3": ("0.04", "token", "k3", None, 0.04),
    "seq_sum_k1": ("0.5_2.0", "seq_sum", "k1", 0.5, 2.0),
    "seq_sum_k2": ("0.3", "seq_sum", "k2", None, 0.3),
    "seq_sum_k3": ("0.3", "seq_sum", "k3", None, 0.3),
    "seq_mean_k1": ("0.9_1.1", "seq_mean", "k1", 0.9, 1.1),
    "seq_mean_k2": ("0.04", "seq_mean", "k2", None, 0.04),
    "seq_mean_k3": ("0.04", "seq_mean", "k3", None, 0.04),
    "seq_max_k2": ("0.15", "seq_max", "k2", None, 0.15),
    "seq_max_k3": ("0.15", "seq_max", "k3", None, 0.15),
}


def compare(core, rch, ActorConfig, seeds: int, dtype) -> dict[str, tuple[float, str]]:
    import hybridflow_ops as ops

    worst: dict[str, tuple[float, str]] = {}

    def record(name: str, diff: float, note: str = "") -> None:
        if name not in worst or diff > worst[name][0]:
            worst[name] = (diff, note if name not in worst else worst[name][1] or note)

    kept: dict[str, list[float]] = {}
    for seed in range(seeds):
        b, r = 6 + seed % 5, 5 + (3 * seed) % 11
        old, rollout, log_probs, adv, mask = _inputs(seed, b, r, dtype, spread=0.3)
        log_ratio = old - rollout
        for level, ours, norm in (("token", ops.truncated_is_weight, None), ("sequence", ops.sequence_is_weight, None),
                                  ("token", ops.truncated_is_weight, "token"), ("sequence", ops.sequence_is_weight, "sequence")):
            spread_old = rollout + (old - rollout) * (0.05 if level == "sequence" else 1.0)  # sequence ratios below the cap too
            verl_w, _ = rch.compute_rollout_correction_weights(spread_old - rollout, mask, level, 2.0, norm is not None)
            w = ours(spread_old, rollout, mask, cap=2.0).is_weights
            if norm is not None:
                w = ops.normalize_is_weight(w, mask, level=norm).is_weights
            record(f"is_weights {level}" + (" + batch normalize" if norm else ""), _max_diff(verl_w, w, mask))
        for option, (threshold, level, estimator, low, high) in REJECTION.items():
            verl_mask, _ = rch.compute_rollout_rejection_mask(log_ratio, mask, option, threshold)
            ours = ops.kl_rejection_mask(old, rollout, mask, level=level, estimator=estimator, low=low, high=high)
            record(f"rejection {option}", _max_diff(verl_mask, ours.response_mask))
            kept.setdefault(f"rejection {option}", []).append(float(ours.response_mask.sum() / mask.sum()))
        verl_mask, _ = rch.compute_rollout_rejection_mask(log_ratio, mask, "token_k1,seq_max_k3", "0.6_1.5,0.15")
        ours = ops.chained_rejection_mask(old, rollout, mask, criteria="token_k1=0.6_1.5,seq_max_k3=0.15")
        record("rejection chained token_k1,seq_max_k3", _max_diff(verl_mask, ours.response_mask))
        kept.setdefault("rejection chained token_k1,seq_max_k3", []).append(float(ours.response_mask.sum() / mask.sum()))

        weights = ops.truncated_is_weight(old, rollout, mask, cap=2.0).is_weights
        _compare_losses(core, ActorConfig, record, old, log_probs, adv, mask, weights)
    for name, shares in kept.items():
        diff, _ = worst[name]
        worst[name] = (diff, f"tokens kept {min(shares):.2f}..{max(shares):.2f}")
    return worst


def _loss_pairs(core, ActorConfig):
    import hybridflow_ops as ops

    cfg = ActorConfig

    return {  # name -> (verl call, our call)
        "ppo_clip_is (verl vanilla, dual clip 3)": (
            lambda o, lp, a, m, w: core.compute_policy_loss_vanilla(o, lp, a, m, "token-mean", cfg(clip_ratio=0.2), w)[0],
            lambda o, lp, a, m, w: ops.ppo_clip_is(lp, o, a, m, w, dual_clip=3.0).loss),
        "gspo_is": (
            lambda o, lp, a, m, w: core.compute_policy_loss_gspo(o, lp, a, m, "seq-mean-token-mean",
                                                                 cfg(clip_ratio_low=3e-4, clip_ratio_high=4e-4), w)[0],
            lambda o, lp, a, m, w: ops.gspo_is(lp, o, a, m, w).loss),
        "sapo_is": (
            lambda o, lp, a, m, w: core.compute_policy_loss_sapo(o, lp, a, m, "seq-mean-token-mean",
                                                                 cfg(tau_pos=1.0, tau_neg=1.05), w)[0],
            lambda o, lp, a, m, w: ops.sapo_is(lp, o, a, m, w, tau_pos=1.0, tau_neg=1.05).loss),
        "gpg_is": (
            lambda o, lp, a, m, w: core.compute_policy_loss_gpg(o, lp, a, m, "token-mean", cfg(), w)[0],
            lambda o, lp, a, m, w: ops.gpg_is(lp, a, m, w).loss),
        "cispo_is": (
            lambda o, lp, a, m, w: core.compute_policy_loss_cispo(o, lp, a, m, "token-mean",
                                                                  cfg(clip_ratio_low=0.2, clip_ratio_high=0.28), w)[0],
            lambda o, lp, a, m, w: ops.cispo_is(lp, o, a, m, w, clip_low=0.2, clip_high=0.28).loss),
        "gmpo_is (verl geo_mean)": (
            lambda o, lp, a, m, w: core.compute_policy_loss_geo_mean(
                o, lp, a, m, "token-mean", cfg(clip_ratio_low=0.4, clip_ratio_high=0.4), w)[0],
            lambda o, lp, a, m, w: ops.gmpo_is(lp, o, a, m, w).loss),
        "kl_cov_is": (
            lambda o, lp, a, m, w: core.compute_policy_loss_kl_cov(
                o, lp, a, m, "token-mean", cfg(policy_loss={"loss_mode": "kl_cov", "kl_cov_ratio": 0.2, "ppo_kl_coef": 1.0}), w)[0],
            lambda o, lp, a, m, w: ops.kl_cov_is(lp, o, a, m, w, kl_cov_ratio=0.2, kl_coef=1.0).loss),
        "reinforce_is": (
            lambda o, lp, a, m, w: core.compute_policy_loss_reinforce(o, lp, a, m, "seq-mean-token-sum", cfg(), w)[0],
            lambda o, lp, a, m, w: ops.reinforce_is(lp, a, m, w).loss),
    }


def _compare_losses(core, ActorConfig, record, old, log_probs, adv, mask, weights) -> None:
    for name, (theirs, ours) in _loss_pairs(core, ActorConfig).items():
        results = []
        args = (old, log_probs, adv, mask, weights)
        if name.startswith("gmpo"):  # verl's geo_mean averages over every row, empty ones too; ours over non-empty rows
            args = tuple(t[mask.any(dim=-1)] for t in args)
        o, log_p, a, m, w = args
        for fn in (theirs, ours):
            lp = log_p.clone().requires_grad_(True)
            loss = fn(o, lp, a, m, w)
            (grad,) = torch.autograd.grad(loss, lp)
            results.append((loss, grad))
        (loss_v, grad_v), (loss_o, grad_o) = results
        record(f"loss {name}", max(_max_diff(loss_v, loss_o), _max_diff(grad_v, grad_o, m)), "loss and d loss / d log_probs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl", required=True, help="directory holding verl's 'verl' package")
    parser.add_argument("--deps", action="append", default=[], help="extra sys.path entry for verl's imports")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--tol", type=float, default=1e-6)
    args = parser.parse_args(argv)
    try:
        core, rch, actor_config = _import_verl(args.verl, args.deps)
    except ImportError as err:
        print(f"verl's modules do not import here: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    worst = compare(core, rch, actor_config, args.seeds, getattr(torch, args.dtype))
    print(f"max abs difference over {args.seeds} random batches ({args.dtype}), tolerance {args.tol:g}:")
    for name, (diff, note) in worst.items():
        flag = "" if diff <= args.tol else "   <-- above tolerance"
        print(f"  {name:45s} {diff:10.3e}  {note}{flag}")
    return 0 if all(d <= args.tol for d, _ in worst.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
