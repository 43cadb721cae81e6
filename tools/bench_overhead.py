"""Benchmark: hybridflow's GRPO step against a hand-written torch GRPO step doing the same math.

    python tools/bench_overhead.py                      # 8 prompts x 8, 8 new tokens, 1 thread, 60 pairs
    python tools/bench_overhead.py --pairs 20 --json    # quicker, one JSON line
    python tools/bench_overhead.py --hand-decode ours   # the hand loop samples with hybridflow's decode()

Both sides start from the same weights (the trainer's tiny model for the built-in
arithmetic task, copied), take the same prompt rows each step (the trainer's loader
draws them; the hand loop gets the same list), sample with a generator seeded alike,
and do the same work per step:

1. tokenise (both cache the token ids of each prompt), left-pad;
2. sample ``n`` responses per prompt at temperature 1 with a KV cache (one prefill per
   prompt, repeated ``n`` times), recording ``log_softmax(logits)`` of each drawn token;
3. decode the texts and score them with the arithmetic rule (0 without an EOS);
4. group advantages ``(s - mean_g) / (std_g + 1e-6)`` (unbiased std);
5. PPO's old log-probs = the rollout's (the reuse pass makes ours do the same);
6. one forward of the policy on prompt + response (each prompt's positions once, its KV cache
   repeated to its ``n`` rows, as hybridflow's train engine does; ``--hand-forward joined``:
   every row's prompt and response as one sequence), log-probs and entropy of the response
   tokens, the clipped surrogate (clip 0.2) averaged over all response tokens, backward;
   rows with zero advantage are skipped on both sides (the count keeps them), or on neither;
7. gradient clipping at 1.0 and one AdamW step (torch's fused AdamW on both sides).

The steps alternate (ours, hand, hand, ours, ...) so that drift falls on both alike;
the first ``--warmup`` pairs are not counted. Each step is timed on two clocks: the wall
clock and the process's CPU time (``time.process_time``). With one torch thread the CPU time
is what the step itself computed, barely touched by other processes on a shared machine
(the wall clock of a step there includes the time the scheduler gave to others); it is the
figure to read on a busy machine, the wall clock on an idle one. Printed: median step time of each side and
the overhead ``median(ours) / median(hand) - 1`` (and the median of the per-pair ratios),
with row skipping on and off. ``--hand-decode ours`` swaps the hand loop's own sampling
loop for :func:`hybridflow.runtime.engines.decode.decode` (whichever path it takes), so the
figure is the framework's cost around the same decoding code.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time

import torch
from transformers.cache_utils import DynamicCache

from hybridflow.runtime.engines.shared_prompt import min_saved_positions  # when the train engine shares prompts


# ----------------------------------------------------------------------------- the hand-written step

class HandGRPO:
    """A plain single-file GRPO step on a transformers causal LM (no hybridflow code unless asked)."""

    def __init__(self, model, tokenizer, *, n: int, new_tokens: int, lr: float, seed: int, skip_rows: bool,
                 decode_fn=None, shared_prompts: bool = True, fused_adam: bool = True):
        self.model, self.tok, self.n, self.new_tokens, self.skip_rows = model, tokenizer, n, new_tokens, skip_rows
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                     fused=fused_adam)  # fused: as hybridflow's train engine on CPU
        self.gen = torch.Generator().manual_seed(seed)
        self.eos, self.pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.ids: dict[str, list[int]] = {}
        self.decode_fn = decode_fn
        self.shared_prompts = shared_prompts

    def prompts(self, rows):
        ids = [self.ids.setdefault(r["prompt"], self.tok(r["prompt"])["input_ids"]) for r in rows]
        width = max(map(len, ids))
        tokens = torch.tensor([[self.pad] * (width - len(i)) + i for i in ids])
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
        return tokens, mask

    @torch.no_grad()
    def sample(self, ids, mask):
        if self.decode_fn is not None:
            from hybridflow.runtime.engines.sampling import SamplingParams

            out = self.decode_fn(self.model, ids, mask, SamplingParams(n=self.n, max_new_tokens=self.new_tokens),
                                 eos_token_ids=[self.eos], pad_token_id=self.pad, generator=self.gen)
            return out.response_ids, out.response_mask, out.log_probs
        m = self.model
        cache = DynamicCache(config=m.config)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = m(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                   logits_to_keep=1).logits[:, -1]
        rows = torch.arange(len(ids)).repeat_interleave(self.n)
        cache.reorder_cache(rows)
        logits, mask, pos = logits[rows], mask[rows], pos[:, -1:][rows] + 1
        b, steps = len(rows), self.new_tokens
        out = torch.full((b, steps), self.pad)
        rmask, logp = torch.zeros(b, steps), torch.zeros(b, steps)
        done = torch.zeros(b, dtype=torch.bool)
        stops = torch.tensor(sorted({self.eos, self.pad}))
        for t in range(steps):
            lp = torch.log_softmax(logits.float(), -1)
            tok = torch.multinomial(lp.exp(), 1, generator=self.gen).squeeze(-1)
            tok = torch.where(done, self.pad, tok)
            rmask[:, t] = (~done).float()
            logp[:, t] = torch.where(done, 0.0, lp.gather(-1, tok[:, None]).squeeze(-1))
            out[:, t] = tok
            done = done | torch.isin(tok, stops)
            if t == steps - 1 or bool(done.all()):
                break
            mask = torch.cat([mask, (~done).long()[:, None]], -1)
            logits = m(input_ids=tok[:, None], attention_mask=mask, position_ids=pos, past_key_values=cache,
                       use_cache=True).logits[:, -1]
            pos = pos + 1
        return out, rmask, logp

    def rewards(self, rows, resp, rmask):
        from hybridflow_ops.rewards.arithmetic import compute_score

        lengths = rmask.sum(-1).long().tolist()
        scores = []
        for i, (ids, length) in enumerate(zip(resp.tolist(), lengths)):
            ids = ids[:length]
            if not ids or ids[-1] != self.eos:
                scores.append(0.0)
                continue
            text = self.tok.decode(ids[:-1], skip_special_tokens=False)
            scores.append(compute_score("arithmetic", text, rows[i // self.n]["ground_truth"]))
        return torch.tensor(scores)

    def step(self, rows) -> float:
        ids, mask = self.prompts(rows)
        self.model.eval()
        resp, rmask, old = self.sample(ids, mask)
        self.mean_length = float(rmask.sum(-1).mean())
        scores = self.rewards(rows, resp, rmask).view(-1, self.n)
        adv = ((scores - scores.mean(-1, keepdim=True)) / (scores.std(-1, keepdim=True) + 1e-6)).view(-1)
        tokens = rmask.sum()
        self.model.train()
        keep = (adv != 0) & (rmask.sum(-1) > 0) if self.skip_rows else torch.ones_like(adv, dtype=torch.bool)
        self.opt.zero_grad(set_to_none=True)
        P = ids.shape[1]
        if bool(keep.any()):
            ids_k, mask_k, resp_k, rm_k = ids.repeat_interleave(self.n, 0)[keep], mask.repeat_interleave(self.n, 0)[keep], resp[keep], rmask[keep]
            attn_r = rm_k.flip(-1).cummax(-1).values.flip(-1).long()
            attn = torch.cat([mask_k, attn_r[:, :-1]], -1)
            groups = len((torch.arange(len(keep)) // self.n)[keep].unique())
            if self.shared_prompts and (len(ids_k) - groups) * P >= min_saved_positions(self.model.config.hidden_size):
                hidden = self._shared_hidden(ids, mask, keep, resp_k, attn)
            else:
                full = torch.cat([ids_k, resp_k[:, :-1]], -1)
                hidden = self.model.model(input_ids=full, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                                          use_cache=False).last_hidden_state[:, P - 1:]
            logits = self.model.lm_head(hidden).float()
            all_lp = torch.log_softmax(logits, -1)
            lp = all_lp.gather(-1, resp_k[..., None]).squeeze(-1)
            entropy = -(all_lp.exp() * all_lp).sum(-1).detach()
            ratio = torch.exp(lp - old[keep])
            a = adv[keep][:, None]
            loss = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2))
            loss = (loss * rm_k).sum() / tokens.clamp(min=1)
            loss.backward()
            _ = float(loss.detach()), float((entropy * rm_k).sum() / rm_k.sum().clamp(min=1))
        else:
            for p in self.model.parameters():
                p.grad = torch.zeros_like(p)
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return norm

    def _shared_hidden(self, ids, mask, keep, resp_k, attn):
        """States before each response token, each prompt's positions run once and its cache repeated to its rows."""
        group = (torch.arange(len(keep)) // self.n)[keep]
        used = group.unique()
        cache = DynamicCache(config=self.model.config)
        out = self.model.model(input_ids=ids[used], attention_mask=mask[used], position_ids=(mask[used].cumsum(-1) - 1).clamp(min=0),
                               past_key_values=cache, use_cache=True).last_hidden_state
        rows = torch.searchsorted(used, group)  # each kept row's place among the used prompts
        first = out[:, -1:][rows]
        if resp_k.shape[1] == 1:
            return first
        cache.reorder_cache(rows)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)[:, ids.shape[1]:]
        rest = self.model.model(input_ids=resp_k[:, :-1], attention_mask=attn, position_ids=pos, past_key_values=cache,
                                use_cache=True).last_hidden_state
        return torch.cat([first, rest], 1)


# ----------------------------------------------------------------------------- the run

def _trainer(args, out: str, skip_rows: bool):
    from hybridflow import PPOConfig
    from hybridflow.algorithms import GRPOTrainer

    class Bench(GRPOTrainer):
        def role_specs(self):
            specs = super().role_specs()
            for spec in specs.values():
                if spec.train is not None:
                    spec.train = spec.train.model_copy(update={"skip_vanishing_rows": skip_rows})
            return specs

    config = PPOConfig(output_dir=out, seed=args.seed, num_threads=args.threads, rollout_batch_size=args.prompts,
                       n_samples=args.group, max_response_length=args.new_tokens, actor_lr=args.lr, kl_coef=0.0,
                       max_steps=10**6, eval_freq=0, trackers=(), progress_bar=False, resume="never",
                       check_contracts=not args.no_contracts, calibrate=False)
    trainer = Bench(config=config)
    trainer.prepare()
    return trainer


def measure(args, skip_rows: bool) -> dict:
    """Interleaved step times of both sides, one setting of row skipping."""
    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(args, out, skip_rows)
        model = trainer.policy_model()  # the actor's starting weights, exported from its worker
        decode_fn = None
        if args.hand_decode == "ours":
            from hybridflow.runtime.engines.decode import decode as decode_fn
        from hybridflow.trainer.seeds import stream_seed

        hand = HandGRPO(model, trainer.tokenizer, n=args.group, new_tokens=args.new_tokens, lr=args.lr,
                        seed=stream_seed(args.seed, "rollout"), skip_rows=skip_rows, decode_fn=decode_fn,
                        shared_prompts=args.hand_forward == "shared")
        times = {"ours": [], "hand": []}
        cpu = {"ours": [], "hand": []}
        same_lengths = 0
        for pair in range(args.warmup + args.pairs):
            rows = trainer.loader.next_batch()
            trainer.step += 1
            order = ("ours", "hand") if pair % 2 == 0 else ("hand", "ours")
            for side in order:
                start, start_cpu = time.perf_counter(), time.process_time()
                if side == "ours":
                    ours_length = trainer.train_step(rows)["response_length/mean"]
                else:
                    hand.step(rows)
                if pair >= args.warmup:
                    times[side].append(time.perf_counter() - start)
                    cpu[side].append(time.process_time() - start_cpu)
            same_lengths += pair >= args.warmup and abs(ours_length - hand.mean_length) < 1e-6
    out = {"skip_rows": skip_rows, "pairs": args.pairs, "same_rollout_lengths": same_lengths}
    for clock, t in (("wall", times), ("cpu", cpu)):
        ours, hand_t = statistics.median(t["ours"]), statistics.median(t["hand"])
        pair_ratio = statistics.median(o / h for o, h in zip(t["ours"], t["hand"]))
        out[clock] = {"ours_ms": round(1e3 * ours, 3), "hand_ms": round(1e3 * hand_t, 3),
                      "overhead_pct": round(100 * (ours / hand_t - 1), 1), "pair_overhead_pct": round(100 * (pair_ratio - 1), 1)}
    return out


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=60, help="measured step pairs per setting")
    parser.add_argument("--warmup", type=int, default=3, help="pairs run first and not counted")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", choices=("on", "off", "both"), default="both", help="zero-advantage row skipping")
    parser.add_argument("--hand-decode", choices=("own", "ours"), default="own",
                        help="the hand loop's sampling: its own KV-cache loop, or hybridflow's decode()")
    parser.add_argument("--hand-forward", choices=("shared", "joined"), default="shared",
                        help="the hand loop's training forward: each prompt once (as ours), or prompt + response rows")
    parser.add_argument("--our-decode", choices=("auto", "hf"), default="auto",
                        help="our rollout engine's decode path: auto (the lean path where it applies) or hf (the transformers loop)")
    parser.add_argument("--no-contracts", action="store_true", help="our run without its contract checks")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.our_decode != "auto":
        import functools

        from hybridflow.runtime.engines import decode as decode_module, rollout_hf

        rollout_hf.decode = functools.partial(decode_module.decode, path=args.our_decode)
    settings = {"on": [True], "off": [False], "both": [True, False]}[args.skip]
    results = [measure(args, s) for s in settings]
    if args.json:
        print(json.dumps(results))
        return results
    print(f"GRPO step, {args.prompts} prompts x {args.group}, {args.new_tokens} new tokens, {args.threads} thread(s), "
          f"{args.pairs} interleaved pairs, our decode: {args.our_decode}, hand decode: {args.hand_decode}, "
          f"hand forward: {args.hand_forward}")
    for r in results:
        print(f"  row skipping {'on' if r['skip_rows'] else 'off'} ({r['same_rollout_lengths']}/{r['pairs']} pairs sampled "
              f"the same response lengths)")
        for clock in ("cpu", "wall"):
            c = r[clock]
            print(f"    {clock:4} ours {c['ours_ms']:7.2f} ms, hand {c['hand_ms']:7.2f} ms -> overhead {c['overhead_pct']:+.1f}% "
                  f"(median of per-pair ratios {c['pair_overhead_pct']:+.1f}%)")
    return results


if __name__ == "__main__":
    main()
