#!/usr/bin/env python3
"""One engine of the zoe vs DeepSpeed harness in a process of its own, so that its peak RSS
(VmHWM) and its disk traffic (/proc/<pid>/io read_bytes, write_bytes) are its own. The engine
"torch" is the fp32 reference: plain torch.optim.AdamW, no ZeRO, no offload.

It builds the model (a Hugging Face model from its config, random init from --seed, fp32 on the
CPU, eager attention), hands it to the engine with the ds_config.json file given, prints one
JSON line {"ready": ...} and then serves the driver (bench/vs_deepspeed/vs_deepspeed.py), one
JSON line a request on stdin, one a reply on stdout:
    {"steps": [i, ...]}  -> trains on those batches of --batches, one step each; replies with the
                            loss, the time (forward, backward, step) and the disk bytes of each step
    {"quit": true}       -> closes the engine and exits
An error (the engine's own exception, verbatim) is replied as {"error": "Type: message"}, after
which the process exits. Everything else (DeepSpeed's and zoe's logs) goes to stderr.

usage: worker.py --engine zoe|deepspeed|torch --model gpt2|llama300m|gpt2b|tiny --config ds_config.json
                 --batches batches.pt [--seed 0]"""
import argparse
import json
import os
import sys
import time
import traceback

MODELS = ("gpt2", "llama300m", "gpt2b", "tiny")


def model_config(name):
    """The transformers config of a harness model (random init; nothing is downloaded)."""
    import transformers
    if name == "gpt2":  # GPT-2 small, 124M parameters (tied head), dropout off so both engines agree
        return transformers.GPT2Config(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    if name == "llama300m":  # a Llama-architecture model of 303M parameters (untied head)
        return transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=18,
                                        num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                                        max_position_embeddings=1024, tie_word_embeddings=False)
    if name == "gpt2b":  # zoe's 2b preset as a GPT-2: 26 layers, width 2560, 20 heads, 256 tokens (2.05B)
        return transformers.GPT2Config(n_embd=2560, n_layer=26, n_head=20, vocab_size=256, n_positions=64,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                       eos_token_id=0)
    if name == "tiny":  # a 2-layer GPT-2 of 0.1M parameters: the harness's own test (tests/python)
        return transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=64,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                       eos_token_id=0)
    raise ValueError(f"unknown model {name!r} (one of {', '.join(MODELS)})")


def build_model(name, seed):
    import torch
    import transformers
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(model_config(name), attn_implementation="eager")
    return model.float().train()


def proc_io():
    """(read_bytes, write_bytes) of this process: what it made the block layer read and write."""
    out = {}
    with open("/proc/self/io") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k.strip()] = int(v)
    return out["read_bytes"], out["write_bytes"]


def vm_hwm():
    """This process's peak RSS in bytes (VmHWM; since the last reset_peak_rss())."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss():
    """Restarts VmHWM from the current RSS (Linux: 5 into clear_refs). False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class ZoeRunner:
    def __init__(self, model, config):
        import zoe
        self.engine = zoe.initialize(model, config=config)
        self.version = getattr(zoe, "__version__", "")
        self.stats = None

    def forward(self, ids):
        return self.engine(input_ids=ids, labels=ids).loss

    def backward(self, loss):
        self.engine.backward(loss)

    def step(self):
        self.stats = self.engine.step()

    def drain(self):
        """Waits for the update zoe overlaps with the next forward (zoe.overlap_step): before the
        other engine's turn, so that it neither runs behind the other engine's steps nor comes
        free to this engine's next one. Reading a master value waits for it (the engine finishes
        the update first); the smallest zoe module's is read."""
        eng = self.engine
        zm = min((z for z in eng._zmods if not z.frozen), key=lambda z: sum(_numel(s) for s in z.shapes))
        eng._eng.read_master(zm.index, 0, _numel(zm.shapes[0]))

    def breakdown(self):
        """zoe's own StepStats of the last step: its t_* times and bytes_* counters."""
        if self.stats is None:
            return {}
        return {**self.stats.times, **self.stats.bytes}

    def close(self):
        self.engine.close()


class DeepSpeedRunner:
    def __init__(self, model, config):
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")
        self.engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        self.version = deepspeed.__version__

    def forward(self, ids):
        return self.engine(input_ids=ids, labels=ids).loss

    def backward(self, loss):
        self.engine.backward(loss)

    def step(self):
        self.engine.step()

    def drain(self):
        """Nothing runs behind DeepSpeed's step() once it returns."""

    def breakdown(self):
        return {}

    def close(self):
        self.engine.destroy()


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class TorchRunner:
    """The reference: plain torch.optim.AdamW on the whole model, with the config's optimizer
    parameters and gradient_clipping (torch.nn.utils.clip_grad_norm_), fp32, no ZeRO and no
    offload: the arithmetic both engines' fp32 losses are compared with."""

    def __init__(self, model, config):
        import torch
        with open(config) as f:
            cfg = json.load(f)
        if cfg.get("bf16", {}).get("enabled") or cfg.get("fp16", {}).get("enabled"):
            raise ValueError("the torch reference is fp32 only")
        p = cfg["optimizer"]["params"]
        self.model = model
        self.clip = float(cfg.get("gradient_clipping", 0.0))
        self.opt = torch.optim.AdamW(model.parameters(), lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"],
                                     weight_decay=p["weight_decay"])
        self.version = torch.__version__

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss

    def backward(self, loss):
        loss.backward()

    def step(self):
        import torch
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def drain(self):
        """Nothing runs behind torch's step."""

    def breakdown(self):
        return {}

    def close(self):
        pass


def make_runner(engine, model, config):
    if engine == "zoe":
        return ZoeRunner(model, config)
    if engine == "deepspeed":
        return DeepSpeedRunner(model, config)
    if engine == "torch":
        return TorchRunner(model, config)
    raise ValueError(f"unknown engine {engine!r} (zoe, deepspeed or torch)")


_REPLIES = None  # the driver's pipe (the process's stdout at start); fd 1 goes to stderr after


def take_stdout():
    """Keeps stdout for the replies and sends everything else written there (DeepSpeed prints its
    logs to stdout, C++ code too) to stderr."""
    global _REPLIES
    _REPLIES = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def reply(obj):
    _REPLIES.write(json.dumps(obj) + "\n")
    _REPLIES.flush()


def error_text(e):
    """The exception as the engine raised it: type and message, verbatim (first 2000 characters)."""
    return f"{type(e).__name__}: {e}"[:2000]


def run_steps(runner, batches, indices):
    import torch
    out = []
    for i in indices:
        ids = batches[i]
        r0, w0 = proc_io()
        t0 = time.perf_counter()
        loss = runner.forward(ids)
        t1 = time.perf_counter()
        runner.backward(loss)
        t2 = time.perf_counter()
        runner.step()
        if i == indices[-1]:  # the engine's turn ends: what runs behind its step is counted in it
            runner.drain()
        t3 = time.perf_counter()
        r1, w1 = proc_io()
        with torch.no_grad():
            value = float(loss.detach().float().item())
        out.append({"i": i, "loss": value, "step_s": t3 - t0, "forward_s": t1 - t0, "backward_s": t2 - t1,
                    "optimizer_s": t3 - t2, "read_bytes": r1 - r0, "write_bytes": w1 - w0,
                    "breakdown": runner.breakdown()})
    return out


def serve(runner, batches):
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("quit"):
            runner.close()
            reply({"closed": True, "peak_rss_bytes": vm_hwm()})
            return 0
        try:
            steps = run_steps(runner, batches, req["steps"])
        except Exception as e:  # noqa: BLE001 (the engine's error goes to the driver verbatim)
            traceback.print_exc(file=sys.stderr)
            reply({"error": error_text(e)})
            return 1
        reply({"steps": steps, "peak_rss_bytes": vm_hwm()})
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", required=True, choices=("zoe", "deepspeed", "torch"))
    ap.add_argument("--model", required=True, choices=MODELS)
    ap.add_argument("--config", required=True, help="the ds_config.json both engines are given")
    ap.add_argument("--batches", required=True, help="a torch file: a list of token id tensors [batch, seq]")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    take_stdout()
    if a.engine == "deepspeed":
        # One rank of the CPU accelerator over gloo, launched as plain python.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(k, v)
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    import torch
    batches = torch.load(a.batches)
    t0 = time.perf_counter()
    try:
        model = build_model(a.model, a.seed)
        n_params = sum(p.numel() for p in model.parameters())
        runner = make_runner(a.engine, model, a.config)
        del model
    except Exception as e:  # noqa: BLE001 (the engine's error goes to the driver verbatim)
        traceback.print_exc(file=sys.stderr)
        reply({"error": error_text(e)})
        return 1
    init_s = time.perf_counter() - t0
    init_peak = vm_hwm()
    reset = reset_peak_rss()
    reply({"ready": True, "init_s": init_s, "init_peak_rss_bytes": init_peak, "peak_reset": reset,
           "params": n_params, "threads": torch.get_num_threads(), "version": runner.version,
           "torch": torch.__version__, "pid": os.getpid()})
    return serve(runner, batches)


if __name__ == "__main__":
    sys.exit(main())
