"""Real public artefacts (TPU captures...) that the tests use but the repository must not hold.

The workplace forbids committing files that the `fetch` tool brought, so a test names the artefact by
(repository, commit, path, sha256) and `real_artefact` finds it, in this order:

1. `$TPUPROF_REAL_DATA`: a folder holding `<owner>+<name>/<path>` or just the file's base name;
2. `shared/real_data/` beside the clone (or beside any folder above it), laid out the same way: the place
   where the CEO can put data files for every engineer;
3. a local bare mirror `.mirror/<owner>+<name>/repo` beside the clone (or above it, or in `$TPUPROF_MIRRORS`), read with
   `git show <commit>:<path>`.

The file is copied into a folder of the caller's (XProf writes cache files beside what it reads, and no
test may write next to an input), its sha256 checked, and the test skipped with the reasons when no
source has it. sample_profiles/real/README.md says where each artefact comes from.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.paths import ROOT


@dataclass(frozen=True)
class Artefact:
    repository: str  # owner/name on GitHub
    commit: str  # full commit id the file is pinned to
    path: str  # path inside the repository
    sha256: str

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def folder_name(self) -> str:
        return self.repository.replace("/", "+")


# A JAX program on a 4-chip v6e (openxla/xprof test data, Apache-2.0): three f32[5,1024,1024,256] arrays in
# pinned host memory (S(5)) copied into HBM, added to, and copied back, every step.
TPU_HOST_OFFLOAD_V6E_4 = Artefact(
    "openxla/xprof", "01d85deb6a7a1bc712e00588ef43b4fc523ee5f7",
    "xprof/convert/test_xplanes/tpu_inference_2.xplane.pb",
    "e312ef8bd5a5104a44b36201bec0e743ef4868cb179c9b67b679c9955f8279c6")
# A Pallas matmul (m, k, n = 2048, 1024, 2048; blocks 512, 512, 1024) run 3 times on a 1-chip v6e
# (vlasenkoalexey/xprof-cli test fixture).
TPU_PALLAS_MATMUL_V6E_1 = Artefact(
    "vlasenkoalexey/xprof-cli", "bdb8194298cdb2986f399b3507db5d609691b00a",
    "tests/fixtures/logdir/plugins/profile/testrun/host0.xplane.pb",
    "cda3e23efdffff0698055de57eaa1a01e50e974a428ff86d7644688906deb4e9")

# The same path at a later commit: the file was committed mangled (every byte above 0x7f replaced by the
# UTF-8 replacement character EF BF BD), a real broken capture.
TPU_HOST_OFFLOAD_MANGLED = Artefact(
    "openxla/xprof", "bfd424c8755973f09f85ba772d25aeebd15c9fed",
    "xprof/convert/test_xplanes/tpu_inference_2.xplane.pb",
    "fb7491b0d632492fc698e54e406c13614fc5eaad52382e649b3ed869fdada6a2")

# The HloProto (with its buffer assignment) that the Pallas matmul capture above ran.
TPU_PALLAS_MATMUL_HLO_PROTO = Artefact(
    "vlasenkoalexey/xprof-cli", "bdb8194298cdb2986f399b3507db5d609691b00a",
    "tests/fixtures/logdir/plugins/profile/testrun/jit_matmul_optimized(17342868964687645945).hlo_proto.pb",
    "904fcd816c84640824aa045c0055c3d93cce7d89d9193e8d8fbb4db5813439d3")
# XProf's GPU demo capture (TF2 BERT on 8 GPUs): not a TPU.
GPU_DEMO_CAPTURE = Artefact(
    "tensorflow/profiler", "d6853e0c4b0d",
    "demo/plugins/profile/GPU-multi-worker/34.83.195.179_6003.xplane.pb",
    "2613d2907394f313c483c7185d6342517f69ff58f5c03c8b5ba5a665779c8e8a")

# Out-of-memory logs of real TPU jobs (vlasenkoalexey/tpu_performance_autoresearch_wiki; pwais/au2018).
_WIKI = "vlasenkoalexey/tpu_performance_autoresearch_wiki"
# A whole XPK job log: JAX Qwen3-8B on v6e, compile OOM "Used 45.12G of 31.25G", 20 allocations.
OOM_QWEN3_JOB_LOG = Artefact(_WIKI, "273bcc2aaa6805a71a6a7983562a08f13ecc2df0", "log.txt",
                             "11befbdff7ec68dbb2297ab3972ddcc1de16ac7ed9d71d7d69caf01ddd835757")
# "Used 35.40G of 31.25G", HLO temp 29.67G with 35.7% fragmentation; the allocation list is cut off.
OOM_QWEN3_CUT_LIST = Artefact(_WIKI, "53811e8d6ef9cc23157feab73dc39b9e1d34381b", "actual_crash.txt",
                              "bf9ce7aa576e0e0e3fbd87dd15881a789724cb483d6c9e436119a3222a4dd09d")
# Only the tail of an allocation list (items 16-20), no headline.
OOM_LIST_TAIL = Artefact(_WIKI, "53811e8d6ef9cc23157feab73dc39b9e1d34381b", "crash_logs.txt",
                         "e302085d9170f5ad7aac0294b99ba872f8005f2a4ba5b83b7ab5e6f521141a3e")
# A TF1 TPUEstimator detection job (v2/v3, 16G HBM): "Used 17.60G of 16.00G", arguments of unknown size. An
# excerpt of the job's log (no commit of its own: found in shared/real_data only).
OOM_TF1_DETECTION = Artefact("pwais/au2018", "", "detection_tpu_oom_excerpt.log",
                             "cb9de2f271a0d0fed84d601f7157781a53b622599c0bbc516df9f4602f0e7104")

REAL_TPU_CAPTURES = {"v6e_4_host_offload": TPU_HOST_OFFLOAD_V6E_4, "v6e_1_pallas_matmul": TPU_PALLAS_MATMUL_V6E_1}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _ancestors() -> list[Path]:
    return [ROOT, *ROOT.parents]


def _candidates(artefact: Artefact) -> list[Path]:
    folders = []
    if os.environ.get("TPUPROF_REAL_DATA"):
        folders.append(Path(os.environ["TPUPROF_REAL_DATA"]))
    # "beside the clone": ../shared/real_data of the clone, and of the folders above it (worktrees live deeper).
    folders += [parent / "shared" / "real_data" for parent in _ancestors()[1:]]
    found = []
    for folder in folders:
        found += [folder / artefact.folder_name / artefact.path, folder / artefact.name]
    return found


def _mirrors(artefact: Artefact) -> list[Path]:
    folders = [parent / ".mirror" for parent in _ancestors()[1:]]
    # A clone elsewhere (CI's) finds the machine's mirror folder through $TPUPROF_MIRRORS (.ci/run sets it).
    if os.environ.get("TPUPROF_MIRRORS"):
        folders.insert(0, Path(os.environ["TPUPROF_MIRRORS"]))
    return [folder / artefact.folder_name / "repo" for folder in folders]


def real_artefact(artefact: Artefact, into: Path) -> Path:
    """A verified copy of ARTEFACT in the folder INTO (created), or pytest.skip with why none was found."""
    into.mkdir(parents=True, exist_ok=True)
    target = into / artefact.name
    if target.exists() and _sha256(target) == artefact.sha256:
        return target
    tried = []
    for candidate in _candidates(artefact):
        if not candidate.is_file():
            continue
        shutil.copyfile(candidate, target)
        if _sha256(target) == artefact.sha256:
            return target
        tried.append(f"{candidate} has another sha256")
    for mirror in _mirrors(artefact):
        if not mirror.is_dir() or not artefact.commit:
            continue
        with open(target, "wb") as out:
            done = subprocess.run(["git", "-C", str(mirror), "show", f"{artefact.commit}:{artefact.path}"],
                                  stdout=out, stderr=subprocess.PIPE, timeout=120)
        if done.returncode == 0 and _sha256(target) == artefact.sha256:
            return target
        tried.append(f"{mirror}: " + (done.stderr.decode(errors="replace").strip().splitlines() or ["sha256 differs"])[-1])
    target.unlink(missing_ok=True)
    where = "; ".join(tried) or "no copy in $TPUPROF_REAL_DATA, shared/real_data/ or a .mirror/ beside the clone"
    pytest.skip(f"real artefact {artefact.repository}@{artefact.commit[:8]}:{artefact.path} not available ({where}); "
                "see sample_profiles/real/README.md")

# After-optimizations HLO texts of LLM train steps on a v6e-8 (vlasenkoalexey/tpu_performance_autoresearch_wiki, no
# licence stated: test use only). Scheduled SPMD modules (8 partitions), scan over the layers, splash attention.
QWEN3_8B_TRAIN_STEP_V6E_8_HLO = Artefact(
    "vlasenkoalexey/tpu_performance_autoresearch_wiki", "53811e8d6ef9cc23157feab73dc39b9e1d34381b",
    "scratch/oom.txt", "2fa4faa291a8d93a5c4d426f47cfac85a19945dcfd0366bac9dcf9f7f6499ca2")
LLAMA3_8B_TRAIN_STEP_V6E_8_HLO = Artefact(
    "vlasenkoalexey/tpu_performance_autoresearch_wiki", "c5e3f7aacc7deb4fa8a9b1b416638b969e0fc75f",
    "raw/profiles/2026-04-27-jax-hlodump-exp28b/module_0262.jit_train_step.cl_854318611.after_optimizations.hlo",
    "8ef5ade50b1a27898639a592e5c6afe2b11c0830416efe0a3d3ee062210410ab")


def shared_folder() -> Path | None:
    """The real-data folder itself ($TPUPROF_REAL_DATA, else shared/real_data beside the clone or above it)."""
    folders = [Path(os.environ["TPUPROF_REAL_DATA"])] if os.environ.get("TPUPROF_REAL_DATA") else []
    folders += [parent / "shared" / "real_data" for parent in _ancestors()[1:]]
    return next((folder for folder in folders if folder.is_dir()), None)


def discovered() -> list[Path]:
    """Every artefact file in the real-data folder (its README aside), whatever it is: the advice audit runs each
    through the commands that read it, so a file added to the folder joins the audit without a test change."""
    folder = shared_folder()
    if folder is None:
        return []
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "README.md")
