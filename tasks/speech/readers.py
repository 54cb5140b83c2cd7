"""Readers of speech datasets in their prepared on-disk layouts.

* Manifest layout (WSJ, TED-LIUM v3 prepared by the Kaldi recipe, and the tiny corpus):
  ``<dir>/<split>.tsv``, one utterance per line: ``path<TAB>duration_s<TAB>transcript``,
  paths relative to ``<dir>`` (or absolute).
* LibriSpeech layout: ``<dir>/<split>/<speaker>/<chapter>/<speaker>-<chapter>-<n>.flac``
  with one ``<speaker>-<chapter>.trans.txt`` per chapter (``<utterance-id> TRANSCRIPT``).

Transcripts are normalised to the CTC alphabet (lower-case letters, apostrophe, single
spaces): CAPE Appendix C.1 removes punctuation from WSJ transcriptions before training.
Before that, the markup tokens of Kaldi-prepared transcripts (``<NOISE>``, ``[NOISE]``,
``<unk>``, ...: :data:`MARKUP_TOKEN`) are dropped, from references and training targets alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._shared.data_checks import CorruptFileError

MANIFEST_LAYOUT = "<split>.tsv with lines 'path<TAB>duration_seconds<TAB>transcript' (paths relative to the folder)"
LIBRISPEECH_LAYOUT = "<split>/<speaker>/<chapter>/<speaker>-<chapter>-<n>.flac + <speaker>-<chapter>.trans.txt"


class SpeechDatasetError(FileNotFoundError):
    """A dataset is missing or malformed; the message names the path and the layout."""


@dataclass(frozen=True)
class Record:
    path: Path
    duration: float  # seconds
    text: str


#: A whole token in brackets is transcription markup, not a spoken word. Kaldi's WSJ recipe
#: (egs/wsj/s5/local/normalize_transcript.pl) writes ``<NOISE>`` for ``[loud_breath]``,
#: ``[lip_smack]`` and the like; its TED-LIUM recipe (egs/tedlium/s5_r3/local/prepare_data.sh)
#: turns ``{NOISE}`` into ``[NOISE]`` and keeps ``<unk>``; other recipes write ``<SPOKEN_NOISE>``
#: or ``[laughter]``. Stripping only the brackets would leave "noise" and "unk" behind as words:
#: WER would charge a perfect recogniser for every tag and CTC would learn to spell "noise" for
#: a breath. wav2letter's and ESPnet's recipes drop these tokens; so does
#: :func:`normalise_transcript`. LibriSpeech and the tiny corpus have no such tokens.
MARKUP_TOKEN = re.compile(r"[<\[{].*[>\]}]")


def spoken_words(text: str) -> list[str]:
    """The whitespace-separated tokens of ``text`` that are not markup (:data:`MARKUP_TOKEN`)."""
    return [token for token in text.split() if not MARKUP_TOKEN.fullmatch(token)]


def normalise_transcript(text: str) -> str:
    """Drop markup tokens, then lower-case, keep letters and apostrophes, words separated by
    single spaces."""
    text = re.sub(r"[^a-z' ]+", " ", " ".join(spoken_words(text)).lower())
    return " ".join(text.split())


def read_manifest(folder: Path, split: str, source: str = "") -> list[Record]:
    folder = Path(folder)
    manifest = folder / f"{split}.tsv"
    if not manifest.is_file():
        raise SpeechDatasetError(
            f"{source or 'speech dataset'}: manifest {manifest} not found.\n"
            f"Expected layout under {folder}: {MANIFEST_LAYOUT}.\n"
            "Prepare it with the Kaldi recipe and list each utterance's audio, duration and transcript."
        )
    records = []
    for number, line in enumerate(manifest.read_text().splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise SpeechDatasetError(
                f"{manifest}:{number}: expected 3 tab-separated fields (path, duration, transcript), "
                f"got {len(fields)}. Layout: {MANIFEST_LAYOUT}"
            )
        path, duration, text = fields
        try:
            seconds = float(duration)
        except ValueError:
            raise SpeechDatasetError(f"{manifest}:{number}: duration {duration!r} is not a number") from None
        records.append(Record(folder / path, seconds, normalise_transcript(text)))
    if not records:
        raise SpeechDatasetError(f"{manifest} lists no utterances. Layout: {MANIFEST_LAYOUT}")
    return records


def read_librispeech(root: Path, split: str) -> list[Record]:
    """Every utterance of one LibriSpeech split; durations from the FLAC headers."""
    import soundfile as sf

    folder = Path(root) / split
    if not folder.is_dir():
        raise SpeechDatasetError(
            f"LibriSpeech {split}: {folder} not found.\nExpected layout under {root}: {LIBRISPEECH_LAYOUT}.\n"
            "Source: https://www.openslr.org/12 (extract e.g. test-clean.tar.gz there)."
        )
    records = []
    for transcript in sorted(folder.glob("*/*/*.trans.txt")):
        for line in transcript.read_text().splitlines():
            if not line.strip():
                continue
            utt_id, _, text = line.partition(" ")
            audio = transcript.parent / f"{utt_id}.flac"
            if not audio.is_file():
                raise SpeechDatasetError(f"{transcript} lists {utt_id} but {audio} is missing")
            records.append(Record(audio, sf.info(str(audio)).duration, normalise_transcript(text)))
    if not records:
        raise SpeechDatasetError(f"LibriSpeech {split}: no *.trans.txt under {folder}. Layout: {LIBRISPEECH_LAYOUT}")
    return records


def read_audio(path: Path, sample_rate: int) -> np.ndarray:
    """(samples, channels) float32 audio of one utterance at ``sample_rate``; a missing,
    undecodable, empty or resampled file is an error naming it."""
    import soundfile as sf

    if not Path(path).is_file():
        raise CorruptFileError(path, "is missing (listed in the manifest)")
    try:
        audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, OSError, ValueError) as err:  # soundfile's errors are RuntimeErrors
        raise CorruptFileError(path, f"cannot be decoded as audio ({err})") from None
    if rate != sample_rate:
        raise CorruptFileError(path, f"{rate} Hz, expected {sample_rate} Hz (data.sample_rate)")
    if len(audio) == 0:
        raise CorruptFileError(path, "holds no audio samples")
    return audio


def check_audio(item: tuple[Path, int]) -> None:
    read_audio(*item)
