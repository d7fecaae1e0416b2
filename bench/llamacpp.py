"""llama.cpp as a peer in the benchmarks: built once per machine, run on the same GGUF.

    .venv/bin/python bench/llamacpp.py [--build-only] [--batch-sizes 1,4,16,32] [--threads 2]
                                       [--prompt-tokens 40] [--new-tokens 64] [--repeats 3]

The source is the llama.cpp vendored in the llama-cpp-python sdist (a pinned
version from PyPI, the one index the build machines reach). `llama-batched-bench`
and `llama-bench` are built with cmake (Release, CPU only, `-march=native`:
the build is per machine) into a cache folder named by the version and a hash
of the CPU's flags, and reused from there on later runs; the cmake build folder
stays there, so a target added later builds incrementally. `llama-quantize`,
`llama-perplexity` and `llama-completion` are built beside them for
bench/kquant_check.py. Where there is no C++
compiler or cmake, `build()` raises `Unavailable` with what is missing
(`pip install cmake` into the venv provides cmake).

Run alone, it prints llama.cpp's decode and prefill on the default model's GGUF
as JSON; `bench/throughput.py --llamacpp` runs it beside Tandem.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cpu_description, machine, machine_line  # noqa: E402

try:
    import fcntl
except ImportError:  # Windows: no lock; do not start two builds at once there
    fcntl = None  # type: ignore[assignment]

VERSION = "0.3.36"  # llama-cpp-python; its sdist vendors llama.cpp's source
TARGETS = ("llama-batched-bench", "llama-bench", "llama-quantize", "llama-perplexity", "llama-completion")


class Unavailable(RuntimeError):
    """llama.cpp cannot be built or run here; the message says why."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tandem" / "bench"


def build_dir() -> Path:
    # -march=native binaries are only valid on CPUs with the same flags.
    flags = " ".join(sorted(cpu_description()["all_flags"]))
    digest = hashlib.sha256(flags.encode()).hexdigest()[:10]
    return cache_root() / f"llamacpp-{VERSION}-{digest}"


def binary(name: str, folder: Path | None = None) -> Path:
    return (folder or build_dir()) / "bin" / name


def _tool(name: str) -> str | None:
    """A build tool on PATH or beside this Python (a venv's `pip install cmake`)."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def _sdist(log) -> Path:
    cached = sorted(cache_root().glob(f"llama_cpp_python-{VERSION}.tar.gz"))
    if cached:
        return cached[0]
    cache_root().mkdir(parents=True, exist_ok=True)
    log(f"downloading the llama-cpp-python {VERSION} sdist from PyPI")
    done = subprocess.run(
        # pip reads an sdist's metadata by building it, in an isolated
        # environment of its own build backend (scikit-build-core, fetched
        # from PyPI too): --no-build-isolation would need that in this venv.
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
         f"llama-cpp-python=={VERSION}", "-d", str(cache_root())],
        capture_output=True, text=True,
    )
    found = sorted(cache_root().glob(f"llama_cpp_python-{VERSION}.tar.gz"))
    if done.returncode != 0 or not found:
        raise Unavailable(f"could not download llama-cpp-python=={VERSION}: {done.stderr.strip()[-500:]}")
    return found[0]


def source_dir(log=lambda line: print(line, file=sys.stderr)) -> Path:
    """llama.cpp's source folder from the llama-cpp-python sdist, extracted once
    (its convert_hf_to_gguf.py and gguf-py are used as they are)."""
    root = cache_root() / "llamacpp-source"
    found = sorted(root.glob("*/vendor/llama.cpp"))
    if found:
        return found[0]
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(_sdist(log)) as archive:
        members = [m for m in archive.getmembers() if "/vendor/llama.cpp/" in m.name + "/"]
        archive.extractall(root, members=members, filter="data")
    return next(root.glob("*/vendor/llama.cpp"))


def build(log=lambda line: print(line, file=sys.stderr)) -> Path:
    """The folder holding bin/llama-batched-bench, built now if not already. Raises Unavailable."""
    folder = build_dir()
    if all(binary(t, folder).exists() for t in TARGETS):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "build.lock", "w") as lock:
        # A second bench started meanwhile waits for this build instead of starting its own.
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not all(binary(t, folder).exists() for t in TARGETS):
            _build_into(folder, log)
    return folder


def _build_into(folder: Path, log) -> None:
    cmake = _tool("cmake")
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    missing = [what for what, found in (("cmake (pip install cmake)", cmake), ("a C++ compiler", compiler)) if not found]
    if missing:
        raise Unavailable(f"llama.cpp not built: this machine lacks {' and '.join(missing)}")
    source = source_dir(log)
    # Kept between builds: a target added to TARGETS later reuses the libraries built before.
    work = folder / "build"
    generator = ["-G", "Ninja"] if _tool("ninja") else []
    configure = [
        cmake, "-S", str(source), "-B", str(work), *generator,
        "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF",
        "-DGGML_VULKAN=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_APP=OFF", f"-DCMAKE_CXX_COMPILER={compiler}",
    ]
    missing_targets = [t for t in TARGETS if not binary(t, folder).exists()]
    jobs = str(os.cpu_count() or 1)
    steps = [configure, [cmake, "--build", str(work), "--target", *missing_targets, "-j", jobs]]
    for step in steps:
        log(f"llama.cpp build: {' '.join(step[:3])} ... (minutes on 2 cores)")
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            raise Unavailable(f"llama.cpp build failed: {(done.stdout + done.stderr).strip()[-2000:]}")
    (folder / "bin").mkdir(exist_ok=True)
    for target in missing_targets:
        shutil.copy2(work / "bin" / target, binary(target, folder))


def convert_hf_to_gguf(folder: Path, outfile: Path, outtype: str) -> Path:
    """llama.cpp's own convert_hf_to_gguf.py on a Hugging Face folder (its
    gguf-py on the path; it imports sentencepiece: `pip install
    sentencepiece` if that is missing). `outtype`: f32, f16, bf16 or q8_0."""
    source = source_dir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(source / "gguf-py"), os.environ.get("PYTHONPATH")])))
    partial = outfile.with_name(outfile.name + ".partial")
    done = subprocess.run(
        [sys.executable, str(source / "convert_hf_to_gguf.py"), str(folder), "--outtype", outtype,
         "--outfile", str(partial)],
        env=env, capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise Unavailable(f"convert_hf_to_gguf.py failed ({done.returncode}):\n{done.stderr[-3000:]}")
    partial.replace(outfile)
    return outfile


def quantize_gguf(source: Path, outfile: Path, qtype: str, threads: int = 2) -> Path:
    """`llama-quantize source outfile qtype` (Q4_K_M, Q5_K_M, Q6_K, ...), as a
    user makes a quantized file from an F16 one."""
    partial = outfile.with_name(outfile.name + ".partial")
    command = [str(binary("llama-quantize", build())), str(source), str(partial), qtype, str(threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise Unavailable(f"llama-quantize failed ({done.returncode}): {(done.stdout + done.stderr)[-1500:]}")
    partial.replace(outfile)
    return outfile


@dataclass(frozen=True)
class BatchedRow:
    """One line of llama-batched-bench's table: B sequences, PP prompt and TG new tokens each."""

    prompt_tokens: int
    new_tokens: int
    batch: int
    prefill_s: float
    prefill_tok_s: float
    decode_s: float
    decode_tok_s: float


_NUMBER = r"\s*([0-9.]+)\s*"
_ROW = re.compile(r"^\|" + r"\|".join([_NUMBER] * 10) + r"\|\s*$")


def parse_batched_bench(text: str) -> list[BatchedRow]:
    """The rows of llama-batched-bench's markdown table
    (| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |);
    log lines around it are ignored."""
    rows = []
    for line in text.splitlines():
        match = _ROW.match(line.strip())
        if match:
            pp, tg, b, _kv, t_pp, s_pp, t_tg, s_tg, _t, _s = match.groups()
            rows.append(BatchedRow(int(pp), int(tg), int(b), float(t_pp), float(s_pp), float(t_tg), float(s_tg)))
    return rows


def run_batched_bench(
    gguf: Path, batch_sizes: list[int], threads: int, prompt_tokens: int, new_tokens: int,
    folder: Path | None = None,
) -> list[BatchedRow]:
    """One llama-batched-bench process: distinct prompts (not shared), as Tandem's throughput bench."""
    context = max(batch_sizes) * (prompt_tokens + new_tokens) + 64
    command = [
        str(binary("llama-batched-bench", folder)), "-m", str(gguf), "-t", str(threads), "-tb", str(threads),
        "-c", str(context), "-b", "2048", "-ub", "512",
        "-npp", str(prompt_tokens), "-ntg", str(new_tokens), "-npl", ",".join(map(str, batch_sizes)),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    rows = parse_batched_bench(done.stdout + "\n" + done.stderr)
    if done.returncode != 0 or not rows:
        raise Unavailable(f"llama-batched-bench failed ({done.returncode}): {(done.stdout + done.stderr)[-1500:]}")
    return rows


def measure(
    gguf: Path, batch_sizes: list[int], threads: int, prompt_tokens: int, new_tokens: int, repeats: int,
) -> dict:
    """Best of `repeats` runs per batch size: {"decode_tok_s": {B: ...}, "prefill_tok_s": {B: ...}}."""
    folder = build()
    decode: dict[str, float] = {}
    prefill: dict[str, float] = {}
    for _ in range(repeats):
        for row in run_batched_bench(gguf, batch_sizes, threads, prompt_tokens, new_tokens, folder):
            key = str(row.batch)
            decode[key] = max(decode.get(key, 0.0), row.decode_tok_s)
            prefill[key] = max(prefill.get(key, 0.0), row.prefill_tok_s)
    return {"decode_tok_s": decode, "prefill_tok_s": prefill, "binary": str(binary("llama-batched-bench", folder))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-only", action="store_true", help="build (or find the cached build) and stop")
    parser.add_argument("--gguf", default=None, help="the GGUF file (default: the default model's)")
    parser.add_argument("--batch-sizes", default="1,4,16,32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=40)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="best of N runs")
    args = parser.parse_args()
    try:
        folder = build()
    except Unavailable as why:
        print(f"skipped: {why}", file=sys.stderr)
        sys.exit(2)
    if args.build_only:
        print(folder)
        return
    from engine.formats.default_model import default_gguf_path

    gguf = Path(args.gguf) if args.gguf else default_gguf_path()
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    result = measure(gguf, sizes, args.threads, args.prompt_tokens, args.new_tokens, args.repeats)
    result["gguf"] = str(gguf)
    result["machine"] = machine(args.threads)
    print(json.dumps(result))
    print(f"machine: {machine_line(result['machine'])}", file=sys.stderr)


if __name__ == "__main__":
    main()
