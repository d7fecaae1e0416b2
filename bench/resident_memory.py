"""Resident memory of Tandem and of llama.cpp on the same GGUF file, the same prompt and reply length.

    .venv/bin/python bench/resident_memory.py --model FILE.gguf [--new-tokens 64] [--context 2048] [--threads 2]

Tandem runs in a fresh process (the file imported beforehand, so the import's
own reading is not counted): its resident set (VmRSS) after importing torch
and the engine (the runtime, before any model), after loading the model, and
after a greedy reply of --new-tokens to a short prompt; its peak (VmHWM); the
KV pool's committed bytes (its pages are committed as sequences use them) and
what grew in anonymous memory from before the load to after the reply, by
/proc/self/smaps. llama.cpp: `llama-completion` on the same file, prompt and
length (`-c --context`, its KV cache f16, allocated whole), its peak resident
set by /usr/bin/time, with its own KV and compute-buffer sizes from its log.

"Model" figures are the process's growth from its runtime alone: Tandem's
from after imports, llama.cpp's whole peak (a C++ binary's own start is a few
MiB). Prints one JSON object; a table on stderr with the machine's CPU line.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import llamacpp  # noqa: E402
from bench.common import machine, machine_line  # noqa: E402

PROMPT = "The history of the harbour"


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _anonymous_mib() -> float:
    total = 0
    anonymous = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                fields = line.split()
                anonymous = len(fields) < 6 or fields[5] in ("[heap]", "[stack]")
            elif anonymous and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total / 1024


def tandem_worker(model: str, new_tokens: int, threads: int) -> dict:
    from engine import Engine

    runtime = _status_mib("VmRSS")
    anonymous = _anonymous_mib()
    with Engine(model, threads=threads) as engine:
        loaded = _status_mib("VmRSS")
        engine.generate(PROMPT, max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        stats = engine.stats()
        return {
            "runtime_mib": round(runtime, 1),
            "loaded_mib": round(loaded, 1),
            "after_reply_mib": round(_status_mib("VmRSS"), 1),
            "peak_mib": round(_status_mib("VmHWM"), 1),
            "anonymous_growth_mib": round(_anonymous_mib() - anonymous, 1),
            "kv_committed_mib": round(stats.kv_bytes_committed / (1 << 20), 1),
            "weights": stats.weights,
        }


def tandem(model: Path, new_tokens: int, threads: int) -> dict:
    # Import first (a separate process), so the measured one only loads the imported folder.
    subprocess.run([sys.executable, "-m", "engine", "generate", "--model", str(model), "--max-tokens", "1",
                    "--prompt", "Hi"], check=True, capture_output=True)
    out = subprocess.run(
        [sys.executable, __file__, "--worker", "--model", str(model), "--new-tokens", str(new_tokens),
         "--threads", str(threads)], check=True, capture_output=True, text=True,
    )
    result = json.loads(out.stdout)
    result["model_mib"] = round(result["after_reply_mib"] - result["runtime_mib"], 1)
    return result


def llama(model: Path, new_tokens: int, context: int, threads: int) -> dict:
    command = ["/usr/bin/time", "-f", "maxrss_kb=%M", str(llamacpp.binary("llama-completion")), "-m", str(model),
               "-p", PROMPT, "-n", str(new_tokens), "-c", str(context), "-t", str(threads), "--temp", "0",
               "-no-cnv", "-v"]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    log = out.stderr

    def mib(pattern: str) -> float | None:
        found = re.findall(pattern + r"\s*=\s*([0-9.]+) MiB", log)
        return float(found[-1]) if found else None

    return {
        "peak_mib": round(int(re.findall(r"maxrss_kb=(\d+)", log)[-1]) / 1024, 1),
        "model_mapped_mib": mib(r"CPU_Mapped model buffer size"),
        "repack_mib": mib(r"CPU_REPACK model buffer size"),
        "kv_mib": mib(r"CPU KV buffer size"),
        "compute_buffer_mib": mib(r"CPU compute buffer size"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--context", type=int, default=2048, help="llama.cpp's -c (its KV cache is allocated whole)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(tandem_worker(args.model, args.new_tokens, args.threads)))
        return
    model = Path(args.model).expanduser()
    result = {
        "model": str(model),
        "file_mib": round(model.stat().st_size / (1 << 20), 1),
        "tandem": tandem(model, args.new_tokens, args.threads),
        "llamacpp": llama(model, args.new_tokens, args.context, args.threads),
        "machine": machine(args.threads),
    }
    print(json.dumps(result, indent=1))
    t, ll = result["tandem"], result["llamacpp"]
    print(machine_line(result["machine"]), file=sys.stderr)
    print(f"{model.name} ({result['file_mib']} MiB file), resident MiB:", file=sys.stderr)
    print(f"  Tandem: runtime {t['runtime_mib']}, + model and reply {t['model_mib']} "
          f"(anonymous {t['anonymous_growth_mib']}, KV committed {t['kv_committed_mib']}), "
          f"total {t['after_reply_mib']}, peak {t['peak_mib']}", file=sys.stderr)
    print(f"  llama.cpp: peak {ll['peak_mib']} (mapped {ll['model_mapped_mib']}, repack {ll['repack_mib']}, "
          f"KV {ll['kv_mib']} for -c {args.context}, compute buffer {ll['compute_buffer_mib']})", file=sys.stderr)


if __name__ == "__main__":
    main()
