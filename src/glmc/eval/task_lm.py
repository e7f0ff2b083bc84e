"""Any glmc model behind lm-evaluation-harness's model interface (lm_eval.api.model.TemplateLM): a Hugging
Face model, or a canonical model that has no Hugging Face form (a path point with circuits), both run
through the evaluator's own forward (glmc.eval.evaluator.Functional). lm-eval's HFLM needs a tokenizer with
an end-of-text token and a Hugging Face model; this one needs neither, so the character-level demo models
are scored by the same task code as any other.

Loglikelihoods follow HFLM's rule: context and continuation are encoded together, the last
max_length + 1 tokens kept, and the continuation scored from the logits before each of its tokens (of a
continuation longer than the window, the tokens the window reaches). Batches
are padded on the right, which a causal model's earlier positions never see."""

from __future__ import annotations

from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from glmc.eval.evaluator import Functional


class ModelLM(TemplateLM):
    """`model` scored by lm-eval's tasks. `tokenizer`: glmc's (encode, decode; eos_id where it has one);
    `max_length`: the longest window the model reads."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, max_length: int, batch_size: int = 32, device="cpu"):
        super().__init__()
        self.function = Functional(model, torch.device(device))
        self.tokenizer, self.max_length, self.batch_size = tokenizer, int(max_length), int(batch_size)
        self.max_gen_toks = 32

    @property
    def eot_token_id(self) -> int | None:
        return getattr(self.tokenizer, "eos_id", None)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        try:
            return list(self.tokenizer.encode(string))
        except KeyError as err:  # a character-level tokenizer meets a character its corpus lacks
            raise ValueError(
                f"a task's text holds {err.args[0]!r}, which the tokenizer has no id for (it knows the characters "
                "of its training corpus only); evaluate tasks written in that corpus's characters"
            ) from None

    def tok_decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids))

    @torch.inference_mode()
    def _scored(self, windows: list[list[int]], targets: list[list[int]]) -> list[tuple[float, bool]]:
        """For each window, the summed log-probability of `targets` (the tokens after its last len(targets)
        positions) and whether each is the most likely; a batch's distributions are dropped once read, so
        a large vocabulary's are never held for the whole task."""
        out: list[tuple[float, bool]] = [(0.0, True)] * len(windows)
        order = sorted(range(len(windows)), key=lambda i: -len(windows[i]))  # like lengths share a batch
        f = self.function
        device = next(iter(f.tensors.values())).device
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            ids = torch.zeros(len(chunk), len(windows[chunk[0]]), dtype=torch.long)
            for row, i in enumerate(chunk):
                ids[row, : len(windows[i])] = torch.tensor(windows[i])
            logits = f.forward(f.tensors, ids.to(device))
            for row, i in enumerate(chunk):
                end, target = len(windows[i]), torch.tensor(targets[i], device=device)
                tail = torch.log_softmax(logits[row, end - len(target) : end].float(), dim=-1)
                logprob = tail.gather(1, target[:, None]).sum().item()
                out[i] = (logprob, bool((tail.argmax(dim=1) == target).all()))
        return out

    @torch.inference_mode()
    def _next_token(self, window: list[int]) -> int:
        """The most likely token after `window` (greedy decoding)."""
        f = self.function
        ids = torch.tensor([window], device=next(iter(f.tensors.values())).device)
        return int(f.forward(f.tensors, ids)[0, -1].argmax())

    def loglikelihood(self, requests, disable_tqdm: bool = True) -> list[tuple[float, bool]]:
        return super().loglikelihood(requests, disable_tqdm=True)  # the caller reports progress per point

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        windows, targets = [], []
        for _, context, continuation in requests:
            whole = (list(context) + list(continuation))[-(self.max_length + 1) :]
            windows.append(whole[:-1])
            # a continuation longer than the window: the tokens the window reaches
            targets.append(list(continuation)[-len(windows[-1]) :])
        return self._scored(windows, targets)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The whole text's log-likelihood in windows of max_length; without an end-of-text token to
        condition the first token on, the text's first token is the condition and is not scored."""
        totals = []
        for (string,) in (req.args for req in requests):
            tokens = self.tok_encode(string)
            prefix = self.eot_token_id
            if prefix is None:
                prefix, tokens = tokens[0], tokens[1:]
            pairs = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(tokens, prefix, self.max_length, context_len=1)
            ]
            scored = self._loglikelihood_tokens([(None, c, t) for c, t in pairs])
            totals.append(sum(logprob for logprob, _ in scored))
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding until one of the request's `until` strings (or max_gen_toks tokens)."""
        outputs = []
        for context, options in (req.args for req in requests):
            until = options.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            budget = int(options.get("max_gen_toks", self.max_gen_toks))
            ids = self.tok_encode(context)
            generated: list[int] = []
            text = ""
            for _ in range(budget):
                window = (ids + generated)[-self.max_length :]
                generated.append(self._next_token(window))
                text = self.tok_decode(generated)
                if any(stop in text for stop in until):
                    break
            for stop in until:
                text = text.split(stop)[0]
            outputs.append(text)
        return outputs
