#!/usr/bin/env python3
"""The summary of a GPU run (scripts/gpu/run.sh): OUT/summary.json and OUT/gpu-run.md, the fragment
for docs/gpu.md, from what the steps left in the work directory. Safe to run after every step: a
step that has not run yet is simply absent. Standard library only.

Usage: summarize.py --work build-gpu --out $OUT --root REPO
"""

import argparse
import glob
import json
import os
import re
import statistics
import subprocess

ACCURACY_TOLERANCE = 0.3  # points: the issue's bound between GPU and CPU mean test accuracy


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def steps(work):
    """The latest record of each step, in the order first seen."""
    out = {}
    try:
        for line in open(os.path.join(work, "steps.jsonl")):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            out.pop(r["step"], None)
            out[r["step"]] = r
    except OSError:
        pass
    return list(out.values())


def gtest_counts(path):
    """run / passed / failed / skipped of a --gtest_output=json file."""
    d = load(path)
    if d is None:
        return None
    c = {"run": 0, "passed": 0, "failed": 0, "skipped": 0, "failed_names": [], "skipped_names": [], "passed_names": [],
         "suites": sorted({s["name"] for s in d.get("testsuites", [])}), "seconds": d.get("time")}
    for suite in d.get("testsuites", []):
        for t in suite.get("testsuite", []):
            if t.get("status") != "RUN":
                continue
            name = f"{suite['name']}.{t['name']}"
            c["run"] += 1
            if t.get("failures"):
                c["failed"] += 1
                c["failed_names"].append(name)
            elif t.get("result") == "SKIPPED":
                c["skipped"] += 1
                c["skipped_names"].append(name)
            else:
                c["passed"] += 1
                c["passed_names"].append(name)
    return c


def memcheck(work):
    """Per compute-sanitizer tool (the log's '=== sanitizer TOOL' sections): errors and tests."""
    log = os.path.join(work, "logs", "memcheck.log")
    if not os.path.exists(log):
        return None
    text = open(log, errors="replace").read()
    sections = re.split(r"^=== sanitizer (\w+)$", text, flags=re.M)
    # Before any marker: an older run.sh's single memcheck run.
    parts = [("memcheck", sections[0])] + list(zip(sections[1::2], sections[2::2]))
    tools = {}
    for tool, body in parts:
        # "ERROR SUMMARY: N errors" (memcheck, synccheck, initcheck; not the "... were not printed"
        # line after it) or racecheck's "RACECHECK SUMMARY: ... (N errors, M warnings)".
        counts = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) errors?$", body, flags=re.M)]
        counts += [int(n) for n in re.findall(r"RACECHECK SUMMARY: .*\((\d+) errors?,", body)]
        if not counts:  # skipped, or the sanitizer did not start: the step table says which
            continue
        name = "memcheck-tests.json" if tool == "memcheck" else f"{tool}-tests.json"
        tools[tool] = {"processes_checked": len(counts), "errors": sum(counts),
                       "tests": gtest_counts(os.path.join(work, "results", name))}
        if tool == "initcheck_apart":  # the reports' classification (run.sh initcheck_apart)
            m = os.path.join(work, "results", "initcheck-apart-map.txt")
            lines = open(m, errors="replace").read().splitlines() if os.path.exists(m) else []
            tools[tool]["check"] = next((x[len("check: "):] for x in lines if x.startswith("check: ")), None)
    return tools or None


def train(work):
    """{device: {model: {precision: {"mean", "seeds", "skipped_steps"}}}} from accuracy.py's JSON."""
    out = {}
    for path in sorted(glob.glob(os.path.join(work, "results", "train-*-*.json"))):
        dev = os.path.basename(path).split("-")[1]
        for r in load(path) or []:
            if r.get("test_accuracy") is None:
                continue
            cell = out.setdefault(dev, {}).setdefault(r["model"], {}).setdefault(
                r["precision"], {"seeds": {}, "skipped_steps": 0, "seconds": 0.0})
            cell["seeds"][str(r["seed"])] = r["test_accuracy"]
            cell["skipped_steps"] += r.get("skipped_steps", 0)
            cell["seconds"] += r.get("seconds", 0.0)
    for dev in out.values():
        for model in dev.values():
            for cell in model.values():
                cell["mean"] = statistics.mean(cell["seeds"].values())
    return out


def accuracy_rows(tr):
    rows = []
    gpu, cpu = tr.get("gpu", {}), tr.get("cpu", {})
    for model in sorted(set(gpu) | set(cpu)):
        for prec in ("fp32", "amp-fp16", "amp-bf16"):
            g, c = gpu.get(model, {}).get(prec), cpu.get(model, {}).get(prec)
            if not g and not c:
                continue
            row = {"model": model, "precision": prec, "gpu_mean": g and g["mean"], "cpu_mean": c and c["mean"],
                   "gpu_seeds": g and g["seeds"], "cpu_seeds": c and c["seeds"]}
            if g and c:
                row["diff"] = g["mean"] - c["mean"]
                row["within_tolerance"] = abs(row["diff"]) <= ACCURACY_TOLERANCE
            rows.append(row)
    return rows


def bench_rows(b):
    """Per config and precision: each impl's median step ms, mixprec's ratios, memory, launches."""
    if not b:
        return []
    rows = []
    for cfg, s in (b.get("summary") or {}).items():
        per = {(r["impl"], r["precision"]): r for r in s["per_impl"]}
        ratios = {r["name"]: r for r in s["ratios"]}
        for prec in b["config"]["precisions"]:
            row = {"config": cfg, "precision": prec}
            for impl in ("mixprec", "mixprec-graph", "mixprec-cl", "pytorch-eager", "pytorch-compile"):
                if (impl, prec) in per:
                    row[f"{impl}_ms"] = per[(impl, prec)]["step_ms_median"]
                for mine in ("mixprec", "mixprec-graph", "mixprec-cl"):
                    r = ratios.get(f"{mine} {prec} vs {impl} {prec} (x faster)")
                    if r:
                        row[f"{mine}_vs_{impl}"] = r["median"]
                sp = ratios.get(f"{impl} {prec} speedup over {impl} fp32")
                if sp:
                    row[f"{impl}_speedup_over_fp32"] = sp["median"]
            for run in b.get("runs", []):
                if run["config"] != cfg or run["precision"] != prec:
                    continue
                res = run["result"]
                if run["impl"] == "mixprec":
                    if isinstance(res.get("peak_bytes"), dict):
                        row["mixprec_peak"] = res["peak_bytes"]
                        row["mixprec_category_peak"] = res.get("category_peak_bytes")
                    launches = res.get("launches") or {}  # nodes of one step captured as a CUDA graph
                    if isinstance(launches.get("kernels_per_step"), (int, float)):
                        row["mixprec_launches_per_step"] = launches["kernels_per_step"]
                        row["mixprec_memsets_per_step"] = launches.get("memsets_per_step")
                        row["mixprec_memcpys_per_step"] = launches.get("memcpys_per_step")
                    elif launches.get("error"):
                        row["mixprec_launches_error"] = launches["error"]
                elif res.get("max_memory_allocated") is not None:
                    row[f"{run['impl']}_max_memory_allocated"] = res["max_memory_allocated"]
                    if res.get("kernels_per_step") is not None:
                        row[f"{run['impl']}_kernels_per_step"] = res["kernels_per_step"]
            rows.append(row)
    return rows


def cuda_sources(root):
    files = sorted(p for p in glob.glob(os.path.join(root, "src", "**", "cuda", "**", "*"), recursive=True)
                   if os.path.isfile(p))
    files += sorted(p for p in glob.glob(os.path.join(root, "src", "**", "*.cu"), recursive=True)
                    if "/cuda/" not in p)
    return [os.path.relpath(p, root) for p in files]


def fmt(v, spec=".2f", none="-"):
    return none if v is None else format(v, spec)


def mib(b):
    return "-" if b is None else f"{b / 2**20:.1f}"


def markdown(s):
    inv = s.get("inventory") or {}
    tc = inv.get("torch", {})
    dev = inv.get("device_line", "unknown device")
    if inv.get("fallback_h200"):
        dev += " — **fell back to an H200** (no H100 was free)"
    libs = inv.get("lib_dirs", {})
    tools = inv.get("tools", {})
    L = [f"### GPU run {s['date']} — {dev}", "",
         f"- commit `{s['commit']}`{' (uncommitted changes)' if s.get('dirty') else ''}"
         f"{' (from the pack: no git there)' if s.get('commit_from') != 'git' else ''}"
         # The device tool's copy of .git can lag the tree it sends (2026-11-26: its HEAD was a
         # commit of the day before): the bundle's own commit, recorded by pack.sh, says what was built.
         f"{'; the bundle was packed at `' + s['bundle_commit'] + '`' if s.get('bundle_commit') and s.get('bundle_commit') != s['commit'] else ''}"
         f"; mixprec from: {s.get('built_how') or 'not set up'}",
         f"- {inv.get('os', '?')}, glibc {inv.get('glibc', '?')}; nvcc {((tools.get('nvcc') or {}).get('version')) or '-'}; "
         f"cuDNN {libs.get('libcudnn', {}).get('version', '-')}, cuBLASLt {libs.get('libcublasLt', {}).get('version', '-')}, "
         f"cudart {libs.get('libcudart', {}).get('version', '-')}; PyTorch {tc.get('torch', '-')} "
         f"(CUDA {tc.get('cuda', '-')}, cuDNN {tc.get('cudnn', '-')})", "",
         "| step | call | status | seconds | note |", "|---|---|---|---|---|"]
    for st in s["steps"]:  # a warm machine keeps earlier calls' results: the call says which
        note = st.get("note", "") if st["status"] != "ok" else ""
        L.append(f"| {st['step']} | {st.get('call', '')} | {st['status']} | {st['seconds']} | {note.replace('|', '/')} |")
    t = s.get("tests")
    if t:
        L += ["", f"**CUDA tests** ({', '.join(t['suites']) or 'no suite matched'}): {t['run']} run, "
                  f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped"]
        if t["failed_names"]:
            L.append("failed: " + ", ".join(f"`{n}`" for n in t["failed_names"][:30]))
        if t["skipped_names"]:
            L.append("skipped: " + ", ".join(f"`{n}`" for n in t["skipped_names"][:30]))
        h = s.get("tests_gpu_hidden")
        if h:
            L.append(f"with the GPU hidden (`CUDA_VISIBLE_DEVICES=-1`): {h['run']} run, {h['passed']} passed, "
                     f"{h['failed']} failed, {h['skipped']} skipped")
    for tool, m in (s.get("memcheck") or {}).items():
        tests = m.get("tests") or {}
        L += ["", f"**compute-sanitizer {tool}**: {fmt(m['errors'], 'd', '?')} errors in "
                  f"{m['processes_checked']} processes; {tests.get('run', '?')} tests run under it, "
                  f"{tests.get('failed', '?')} failed" + (f"; {m['check']}" if m.get("check") else "")]
    acc = s.get("accuracy")
    if acc:
        L += ["", f"**Test accuracy after {s.get('train_epochs', 5)} epochs** (%, mean of seeds; "
                  f"GPU − CPU within ±{ACCURACY_TOLERANCE})", "",
              "| model | precision | GPU mean | CPU mean | GPU − CPU | ok | GPU per seed | CPU per seed |",
              "|---|---|---|---|---|---|---|---|"]
        for r in acc:
            seeds = lambda d: " / ".join(f"{v:.2f}" for _, v in sorted(d.items())) if d else "-"  # noqa: E731
            ok = "" if "within_tolerance" not in r else ("yes" if r["within_tolerance"] else "**no**")
            L.append(f"| {r['model']} | {r['precision']} | {fmt(r['gpu_mean'])} | {fmt(r['cpu_mean'])} | "
                     f"{fmt(r.get('diff'), '+.2f')} | {ok} | {seeds(r['gpu_seeds'])} | {seeds(r['cpu_seeds'])} |")
    b = s.get("bench")
    if b:
        L += ["", "**Step time** (ms, median over interleaved repeats; mixprec vs PyTorch: x faster, > 1 is "
                  "mixprec ahead; graph: `mixprec bench --cuda-graph`)", "",
              "| config | precision | mixprec | mixprec graph | PyTorch eager | torch.compile | vs eager | "
              "graph vs eager | vs compile | amp speed-up mixprec / eager |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in b:
            L.append(f"| {r['config']} | {r['precision']} | {fmt(r.get('mixprec_ms'), '.3f')} | "
                     f"{fmt(r.get('mixprec-graph_ms'), '.3f')} | "
                     f"{fmt(r.get('pytorch-eager_ms'), '.3f')} | {fmt(r.get('pytorch-compile_ms'), '.3f')} | "
                     f"{fmt(r.get('mixprec_vs_pytorch-eager'))} | {fmt(r.get('mixprec-graph_vs_pytorch-eager'))} | "
                     f"{fmt(r.get('mixprec_vs_pytorch-compile'))} | "
                     f"{fmt(r.get('mixprec_speedup_over_fp32'))} / {fmt(r.get('pytorch-eager_speedup_over_fp32'))} |")
        cl = [r for r in b if r.get("mixprec-cl_ms") is not None]
        if cl:  # `--impls ...,mixprec-cl`: the cnns with --channels-last
            L += ["", "**Channels-last** (`mixprec bench --channels-last`, ms, median; the same repeats)", "",
                  "| config | precision | mixprec | mixprec channels-last | vs eager | vs compile |", "|---|---|---|---|---|---|"]
            for r in cl:
                L.append(f"| {r['config']} | {r['precision']} | {fmt(r.get('mixprec_ms'), '.3f')} | "
                         f"{fmt(r.get('mixprec-cl_ms'), '.3f')} | {fmt(r.get('mixprec-cl_vs_pytorch-eager'))} | "
                         f"{fmt(r.get('mixprec-cl_vs_pytorch-compile'))} |")
        L += ["", "**Peak GPU memory of the step** (MiB; mixprec by category, PyTorch "
                  "`max_memory_allocated` less what was allocated before the model) and kernels per step", "",
              "| config | precision | mixprec total | params | grads | optimizer | activations | temporaries | "
              "workspace | data | PyTorch eager | launches mixprec / eager / compile |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in b:
            cat = r.get("mixprec_category_peak") or {}
            tot = (r.get("mixprec_peak") or {}).get("total")
            L.append(f"| {r['config']} | {r['precision']} | {mib(tot)} | " + " | ".join(
                mib(cat.get(k)) for k in ("parameters", "gradients", "optimizer_state", "activations",
                                          "temporaries", "workspace", "data"))
                + f" | {mib(r.get('pytorch-eager_max_memory_allocated'))} | "
                f"{fmt(r.get('mixprec_launches_per_step'), '.0f')} / {fmt(r.get('pytorch-eager_kernels_per_step'), '.0f')}"
                f" / {fmt(r.get('pytorch-compile_kernels_per_step'), '.0f')} |")
    if s.get("bench_skipped"):
        L += ["", "not run in the bench: " + "; ".join(f"{k}: {v.splitlines()[0][:120]}"
                                                      for k, v in s["bench_skipped"].items())]
    files = s.get("cuda_sources", [])
    # A test skipped because there is a GPU (a no-GPU test) counts where it passed with the GPU hidden.
    hidden = s.get("tests_gpu_hidden") or {}
    hidden_passed = set(hidden.get("passed_names", []))
    ran = bool(t and t["run"] and not t["failed"] and inv.get("gpus")
               and all(n in hidden_passed for n in t["skipped_names"]))
    L += ["", f"**CUDA sources at this commit** ({len(files)}): "
              + ("all ran on the GPU through the CUDA tests above" if ran else "not shown to run on a GPU by this run"),
          ""] + [f"- `{f}`" for f in files]
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--root", required=True)
    a = ap.parse_args()
    res = os.path.join(a.work, "results")

    def git(*args):
        p = subprocess.run(["git", "-C", a.root] + list(args), capture_output=True, text=True)
        return p.stdout.strip() if p.returncode == 0 else None

    built_how = None
    env = os.path.join(a.work, "env.sh")
    if os.path.exists(env):
        m = re.search(r"^BUILT_HOW=(.*)$", open(env).read(), re.M)
        built_how = m and m.group(1).strip("'\"").replace("\\ ", " ")
    manifest = load(os.path.join(a.root, "gpu-pack", "manifest.json")) or {}
    # The tree may travel without .git: then the commit is the one the pack was made at.
    commit = git("rev-parse", "HEAD")
    commit_from = "git" if commit else "gpu-pack/manifest.json"
    commit = commit or manifest.get("commit", "?")
    dirty = git("status", "--porcelain", "-uno")
    bench = load(os.path.join(res, "bench.json"))
    tr = train(a.work)
    s = {
        "date": __import__("datetime").datetime.now(__import__("datetime").timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit, "commit_from": commit_from, "dirty": bool(dirty), "bundle_commit": manifest.get("commit"),
        "built_how": built_how, "steps": steps(a.work), "inventory": load(os.path.join(res, "inventory.json")),
        "tests": gtest_counts(os.path.join(res, "tests.json")),
        "tests_gpu_hidden": gtest_counts(os.path.join(res, "tests-gpu-hidden.json")), "memcheck": memcheck(a.work),
        "train": tr, "accuracy": accuracy_rows(tr), "train_epochs": int(os.environ.get("TRAIN_EPOCHS", "5")),
        "bench": bench_rows(bench), "bench_environment": bench and bench.get("environment"),
        "bench_complete": bench and bench.get("complete"), "bench_skipped": bench and bench.get("skipped"),
        "cuda_sources": cuda_sources(a.root),
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    with open(os.path.join(a.out, "gpu-run.md"), "w") as f:
        f.write(markdown(s))


if __name__ == "__main__":
    main()
