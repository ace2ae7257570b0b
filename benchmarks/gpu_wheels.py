"""The wheel set of benchmarks/gpu_check.sh: check it against its pinned list and install it offline.

    python benchmarks/gpu_wheels.py check   [--wheels .gpu-wheels] [--list benchmarks/gpu_wheels.txt]
    python benchmarks/gpu_wheels.py install [--wheels .gpu-wheels] [--list ...] --target DIR [--strict]

`check`: every pinned wheel is present with its sha256 and the set is under 60 MiB. `install`: the same
check, then `pip install --no-index --no-deps --no-compile --target DIR` of every wheel this interpreter
can load (its tags); `--strict` (the GPU run) fails when one cannot be loaded, otherwise (the CPU dry run
on another Python) such a wheel is skipped and recorded. A manifest (DIR/gpu-wheels.json: installed,
skipped, top-level modules of each) is what gpu_check.py reports. Only the standard library and
`packaging` are imported, so this runs before anything of ours is importable.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MIB = 60
MANIFEST = "gpu-wheels.json"


def pinned(list_path: Path) -> dict[str, tuple[str, str]]:
    """{normalised name: (version, sha256)} from a `name==version --hash=sha256:…` list."""
    out = {}
    for line in list_path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, _, digest = line.partition("--hash=sha256:")
        name, _, version = spec.strip().partition("==")
        out[_norm(name)] = (version.strip(), digest.strip())
    return out


def _norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def check(wheels: Path, list_path: Path) -> tuple[list[Path], list[str]]:
    """(the pinned wheel files, problems): each pin present once with its sha256, the set < 60 MiB."""
    pins = pinned(list_path)
    files = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    problems, chosen = [], []
    for name, (version, digest) in pins.items():
        found = [f for f in files if _norm(f.name.split("-")[0]) == name and f.name.split("-")[1] == version]
        if len(found) != 1:
            problems.append(f"{name}=={version}: {len(found)} wheels in {wheels} (run `make gpu-wheels`)")
            continue
        if digest and _sha256(found[0]) != digest:
            problems.append(f"{found[0].name}: sha256 is not the pinned {digest}")
        chosen.append(found[0])
    extra = sorted(set(files) - set(chosen))
    problems += [f"{f.name}: not in {list_path.name} (two versions stop the install)" for f in extra
                 if _norm(f.name.split("-")[0]) in pins]
    size = sum(f.stat().st_size for f in chosen)
    if size > LIMIT_MIB * 2 ** 20:
        problems.append(f"the wheel set is {size / 2 ** 20:.1f} MiB, over {LIMIT_MIB} MiB")
    return chosen, problems


def loadable(wheel: Path) -> bool:
    """Whether this interpreter can load the wheel (one of its tags is among the interpreter's)."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    _, _, _, tags = parse_wheel_filename(wheel.name)
    return bool(set(tags) & set(sys_tags()))


def top_level(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        names = {n.split("/", 1)[0] for n in zf.namelist()}
    return sorted(n.removesuffix(".py") for n in names if not n.endswith((".dist-info", ".data")))


def install(wheels: Path, list_path: Path, target: Path, strict: bool) -> dict:
    chosen, problems = check(wheels, list_path)
    if problems:
        raise SystemExit("gpu wheels: " + "; ".join(problems))
    ok = [w for w in chosen if loadable(w)]
    skipped = {w.name: f"not loadable by Python {sys.version_info.major}.{sys.version_info.minor} here"
               for w in chosen if w not in ok}
    if skipped and strict:
        raise SystemExit(f"gpu wheels: {sorted(skipped)} cannot be loaded by this interpreter ({sys.executable})")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    if ok:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--disable-pip-version-check", "--target", str(target),
                        *map(str, ok)], check=True)
    manifest = {"target": str(target), "list": str(list_path), "bytes": sum(w.stat().st_size for w in chosen),
                "installed": {w.name: top_level(w) for w in ok}, "skipped": skipped}
    (target / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["check", "install"])
    ap.add_argument("--wheels", type=Path, default=ROOT / ".gpu-wheels")
    ap.add_argument("--list", type=Path, default=ROOT / "benchmarks" / "gpu_wheels.txt")
    ap.add_argument("--target", type=Path, default=None)
    ap.add_argument("--strict", action="store_true", help="every wheel must load here (the GPU run)")
    args = ap.parse_args(argv)
    if args.action == "check":
        chosen, problems = check(args.wheels, args.list)
        for p in problems:
            print(p, file=sys.stderr)
        print(f"{len(chosen)} wheels, {sum(w.stat().st_size for w in chosen) / 2 ** 20:.1f} MiB"
              f" (limit {LIMIT_MIB} MiB){'' if not problems else ': ' + str(len(problems)) + ' problems'}")
        return 1 if problems else 0
    if args.target is None:
        ap.error("install needs --target")
    m = install(args.wheels, args.list, args.target, args.strict)
    print(f"installed {len(m['installed'])} wheels into {args.target}"
          + (f"; skipped {sorted(m['skipped'])}" if m["skipped"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
