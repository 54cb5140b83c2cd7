"""The tiny speech corpus: sentences spoken by espeak-ng, built once and cached on disk.

Everything is drawn from one seeded generator, so the corpus is a function of its
parameters; the cache directory is named after a hash of them and a finished build is
renamed into place atomically (a killed build leaves nothing half-written behind).

The corpus is written in the manifest layout of :mod:`.speech_readers` (``<split>.tsv`` of
path, duration, transcript next to 16 kHz FLAC files), so the tiny profile exercises the
same reader as the paper profile.

Training and validation utterances are short; test utterances span short to clearly
longer, so the last duration bin holds lengths never seen in training (CAPE Section 5.2).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pe_bench.harness.data import cache_root

SAMPLE_RATE = 16_000

# 72 plain words with distinct spellings, a few with apostrophes so that the apostrophe
# token of the CTC head occurs in the data (every letter but 'z' does too).
_WORDS = (
    "the a red blue green black white small big old new cat dog bird fish horse cow sheep "
    "house car boat tree river hill road door window table chair book cup runs jumps sits "
    "sleeps eats sees likes finds takes opens near under over behind with without and but "
    "then today night morning quickly slowly very one two three four five six seven eight "
    "nine ten don't can't it's she's we're they'll"
)
VOCABULARY = _WORDS.split()

# espeak-ng voices and variants: several accents, male and female timbres.
VOICES = (
    "en-us+m1", "en-us+f2", "en-gb+m3", "en-gb+f1", "en-gb-x-rp+m2",
    "en-gb-scotland+f3", "en-us+m4", "en-gb-x-gbclan+f4",
)  # fmt: skip
SPEEDS = (150, 165, 180, 195)  # words per minute
PITCHES = (30, 45, 60, 75)


class EspeakMissingError(RuntimeError):
    pass


@dataclass(frozen=True)
class CorpusSpec:
    """Everything the corpus depends on (its hash names the cache directory)."""

    seed: int = 0
    train_size: int = 1200
    valid_size: int = 150
    test_size: int = 300
    train_words: tuple[int, int] = (2, 5)  # inclusive range of words per training utterance
    test_words: tuple[int, int] = (2, 14)
    noise: float = 0.003  # std of added white noise (clean espeak audio is too easy to overfit)

    def key(self) -> str:
        text = json.dumps(asdict(self) | {"version": 1}, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]


def espeak_binary() -> str:
    binary = shutil.which("espeak-ng")
    if binary is None:
        raise EspeakMissingError(
            "the tiny speech corpus is synthesised with espeak-ng, which is not installed; "
            "install it with `apt-get install espeak-ng` (macOS: `brew install espeak-ng`)"
        )
    return binary


def espeak_version(binary: str) -> str:
    """``espeak-ng --version``'s version number (its first line: "eSpeak NG text-to-speech:
    1.51  Data at: ...")."""
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    words = done.stdout.replace(":", " ").split()
    return next((w for w in words if w[:1].isdigit()), done.stdout.strip() or "unknown")


def corpus_built_with(root: Path) -> dict[str, str]:
    """The espeak-ng version a built corpus was synthesised with ("unrecorded" for corpora
    built before it was recorded)."""
    spec = json.loads((root / "spec.json").read_text())
    return {"espeak-ng": spec.get("espeak-ng", "unrecorded")}


@dataclass(frozen=True)
class Utterance:
    name: str
    text: str
    voice: str
    speed: int
    pitch: int


def plan_split(rng: np.random.Generator, split: str, count: int, words: tuple[int, int]) -> list[Utterance]:
    plan = []
    for i in range(count):
        n = int(rng.integers(words[0], words[1] + 1))
        text = " ".join(rng.choice(VOCABULARY, size=n))
        voice = VOICES[int(rng.integers(len(VOICES)))]
        plan.append(Utterance(f"{split}-{i:05d}", text, voice, int(rng.choice(SPEEDS)), int(rng.choice(PITCHES))))
    return plan


def synthesise(binary: str, utt: Utterance, workdir: Path) -> np.ndarray:
    """espeak-ng's 22.05 kHz output resampled to 16 kHz, float32 in [-1, 1]."""
    import soundfile as sf
    import torch
    import torchaudio.functional as AF

    wav = workdir / f"{utt.name}.wav"
    cmd = [binary, "-v", utt.voice, "-s", str(utt.speed), "-p", str(utt.pitch), "-w", str(wav), utt.text]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"espeak-ng failed on {utt.name} ({' '.join(cmd)}): {done.stderr.strip()}")
    audio, rate = sf.read(wav, dtype="float32")
    wav.unlink()
    return AF.resample(torch.from_numpy(audio), rate, SAMPLE_RATE).numpy()


def build_corpus(spec: CorpusSpec, root: Path | None = None, workers: int = 4) -> Path:
    """The corpus directory for ``spec`` (built on first use, then read from the cache)."""
    import soundfile as sf

    root = Path(root or cache_root()) / "speech-tiny" / spec.key()
    if (root / "test.tsv").is_file():
        return root
    binary = espeak_binary()
    rng = np.random.default_rng(spec.seed)
    splits = {
        "train": plan_split(rng, "train", spec.train_size, spec.train_words),
        "valid": plan_split(rng, "valid", spec.valid_size, spec.train_words),
        "test": plan_split(rng, "test", spec.test_size, spec.test_words),
    }
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        (staging / "audio").mkdir()
        for index, (split, plan) in enumerate(splits.items()):
            # Noise comes from a per-split generator drawn in order, so threads don't change it.
            noise_rng = np.random.default_rng([spec.seed, index])
            with ThreadPoolExecutor(workers) as pool:  # espeak-ng runs as separate processes
                audios = list(pool.map(lambda u: synthesise(binary, u, staging), plan))
            rows = []
            for utt, audio in zip(plan, audios, strict=True):
                audio = audio + spec.noise * noise_rng.standard_normal(audio.shape).astype(np.float32)
                path = Path("audio") / f"{utt.name}.flac"
                sf.write(staging / path, np.clip(audio, -1, 1), SAMPLE_RATE, format="FLAC")
                rows.append(f"{path}\t{len(audio) / SAMPLE_RATE:.3f}\t{utt.text}")
            (staging / f"{split}.tsv").write_text("\n".join(rows) + "\n")
        built_with = {"espeak-ng": espeak_version(binary)}  # other versions speak otherwise
        (staging / "spec.json").write_text(json.dumps(asdict(spec) | built_with, indent=1))
        try:
            staging.rename(root)
        except OSError:  # another process finished the same build first: theirs is as good
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return root
