"""Where the repository and its committed samples are."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
SAMPLES = ROOT / "sample_profiles"
DUMPS = SAMPLES / "dumps"
