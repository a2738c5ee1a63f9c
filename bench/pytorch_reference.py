#!/usr/bin/env python3
"""PyTorch + transformers + peft reference for crates/model's throughput bench.

Measures, on CPU with a fixed thread count and the same SmolLM2 GGUF weights (dequantised to
f32 by transformers), the same three numbers as `cargo bench -p model --bench throughput`:
prefill tokens/s (one 512-token prompt), decode tokens/s (greedy steps after a 128-token
prompt, with the KV cache; also for several prompts decoded together, `--decode-batches`), and the time of one LoRA forward + backward + AdamW step on a
batch of 8 x 512 tokens (r=16, alpha=32, all seven projections, grad-norm clip 1.0).

Installs its own dependencies into bench/.venv on first run (torch, transformers, peft, gguf
from PyPI) and re-executes itself there. Prints one JSON object on stdout.

    python3 bench/pytorch_reference.py --gguf PATH [--threads 2] [--prefill 512] [--decode 64]
        [--decode-batches 1,4,8] [--batch 8] [--seq 512] [--rank 16] [--repeats 3] [--skip-train]
        [--device cpu|cuda] [--dtype f32|bf16]

With `--device cuda` it times the GPU, synchronising before each clock read. It runs under
the Python that started it when that already has torch, transformers, peft and gguf (a GPU
machine's image); otherwise it installs them into bench/.venv.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
VENV = HERE / ".venv"
REQUIREMENTS = ["torch", "transformers", "peft", "gguf", "sentencepiece"]


def ensure_venv():
    if pathlib.Path(sys.prefix).resolve() == VENV.resolve():
        return
    try:
        import torch, transformers, peft, gguf  # noqa: F401  (a prepared image has them)
        return
    except ImportError:
        pass
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    probe = subprocess.run([str(python), "-c", "import torch, transformers, peft, gguf"],
                           capture_output=True)
    if probe.returncode != 0:
        print("installing " + " ".join(REQUIREMENTS) + " into " + str(VENV), file=sys.stderr)
        subprocess.check_call([str(python), "-m", "pip", "install", "-q",
                               "--disable-pip-version-check", *REQUIREMENTS])
    os.execv(str(python), [str(python), __file__, *sys.argv[1:]])


def token_ids(n, vocab, seed):
    """Same LCG as the Rust bench, so both sides see identical inputs."""
    mask = (1 << 64) - 1
    a, c = 6364136223846793005, 1442695040888963407
    state = (seed * a + c) & mask
    out = []
    for _ in range(n):
        state = (state * a + c) & mask
        out.append((state >> 33) % (vocab - 256) + 256)
    return out


def default_gguf():
    root = os.environ.get("PATHFINDER_CACHE")
    base = pathlib.Path(root) / "models" if root else pathlib.Path.home() / ".cache/pathfinder/models"
    return str(base / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", default=default_gguf())
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--decode-batches", default="1,4,8")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    # Flags of the Rust side only, accepted so that bench/run.sh can pass one list to both.
    p.add_argument("--micro-batch", help="Rust side only: PyTorch runs the batch in one pass")
    p.add_argument("--train-kernels", help="Rust side only: candle's or crates/model's kernels")
    p.add_argument("--check-cpu", action="store_true", help="Rust side only: CPU parity")
    p.add_argument("--fit-steps", help="Rust side only: the short fit")
    p.add_argument("--fit-lr", help="Rust side only: the short fit")
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    path = pathlib.Path(args.gguf)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    device = torch.device(args.device)
    try:  # transformers >= 4.56 names it `dtype`; older ones only `torch_dtype`
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=dtype)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     torch_dtype=dtype)
    model = model.to(device)
    model.eval()
    vocab = model.config.vocab_size

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def tensor(rows):
        return torch.tensor(rows, device=device)

    prompt = tensor([token_ids(args.prefill, vocab, 1)])
    prefill = []
    with torch.inference_mode():
        for _ in range(args.repeats + (1 if device.type == "cuda" else 0)):
            sync()
            t = time.perf_counter()
            model(prompt, use_cache=True)
            sync()
            prefill.append(time.perf_counter() - t)
        if device.type == "cuda":
            prefill = prefill[1:]  # the first call loads kernels
    prefill_tok_s = args.prefill / statistics.median(prefill)

    def decode_seconds(prompts):
        """Seconds for `args.decode` greedy steps after pre-filling `prompts` (one row each)."""
        with torch.inference_mode():
            out = model(prompts, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1]
            sync()
            t = time.perf_counter()
            for _ in range(args.decode):
                nxt = logits.argmax(-1, keepdim=True)
                out = model(nxt, past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[:, -1]
            sync()
            return time.perf_counter() - t

    short = tensor([token_ids(128, vocab, 2)])
    decode = [decode_seconds(short) for _ in range(args.repeats)]
    decode_tok_s = args.decode / statistics.median(decode)

    # Batched decode: one 128-token prompt per row (same LCG seeds as the Rust side), together.
    batched = {}
    for rows in [int(n) for n in args.decode_batches.split(",")]:
        prompts = tensor([token_ids(128, vocab, 10 + r) for r in range(rows)])
        times = [decode_seconds(prompts) for _ in range(args.repeats)]
        batched[str(rows)] = rows * args.decode / statistics.median(times)
        print(f"decode at batch {rows}: {batched[str(rows)]:.1f} tokens/s", file=sys.stderr)

    train_step_s = None
    if not args.skip_train:
        from peft import LoraConfig, get_peft_model
        cfg = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                         "gate_proj", "up_proj", "down_proj"],
                         task_type="CAUSAL_LM")
        peft_model = get_peft_model(model, cfg)
        peft_model.train()
        params = [p for p in peft_model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
        ids = tensor(token_ids(args.batch * args.seq, vocab, 3)).view(args.batch, args.seq)
        times = []
        for step in range(max(args.repeats, 2)):
            sync()
            t = time.perf_counter()
            loss = peft_model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            dt = time.perf_counter() - t
            print(f"train step {step}: {dt:.2f}s", file=sys.stderr)
            if step > 0:
                times.append(dt)
        train_step_s = statistics.median(times)

    print(json.dumps({
        "impl": f"pytorch {torch.__version__} + transformers + peft ({args.dtype}, "
                f"attn={model.config._attn_implementation})",
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "threads": args.threads,
        "prefill_tokens": args.prefill,
        "prefill_tok_s": prefill_tok_s,
        "decode_tokens": args.decode,
        "decode_tok_s": decode_tok_s,
        "decode_batch_tok_s": batched,
        "train_batch": args.batch,
        "train_seq": args.seq,
        "lora_rank": args.rank,
        "train_step_s": train_step_s,
    }))


if __name__ == "__main__":
    ensure_venv()
    main()
