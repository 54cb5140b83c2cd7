"""Speech manifests on tiny FLAC fixtures: every audio error names its file, ``pe-bench
check-data`` decodes every utterance of every split."""

from __future__ import annotations

import pytest
import soundfile as sf
from test_task_speech import RATE, tone

from pe_bench.harness.cli import main
from pe_bench.harness.config import load_run_config
from pe_bench.tasks import get_task
from pe_bench.tasks._shared.data_checks import CorruptFileError

SPLITS = ("si284", "nov93dev", "nov92")  # the wsj paper profile's manifests


def write_wsj(data_root, per_split=2):
    """<data_root>/wsj/{si284,nov93dev,nov92}.tsv listing FLAC files under wav/."""
    folder = data_root / "wsj"
    (folder / "wav").mkdir(parents=True)
    for split in SPLITS:
        rows = []
        for k in range(per_split):
            name = f"wav/{split}_{k}.flac"
            sf.write(folder / name, tone(0.3 + 0.1 * k), RATE)
            rows.append(f"{name}\t{0.3 + 0.1 * k}\tsay {split} {k}\n")
        (folder / f"{split}.tsv").write_text("".join(rows))
    return folder


def test_an_undecodable_utterance_is_an_error_naming_the_file(tmp_path):
    folder = write_wsj(tmp_path)
    broken = folder / "wav" / "nov92_1.flac"
    broken.write_bytes(b"fLaC but then nothing useful" * 3)
    data = get_task("wsj")(load_run_config("wsj", "paper"), tmp_path).datamodule(0)
    data.setup()
    test = data.splits["test"]
    assert test[0][0].shape[1] == 80  # the readable one still loads
    with pytest.raises(CorruptFileError) as err:
        test[1]
    assert str(err.value).startswith(f"{broken}: cannot be decoded as audio")


def test_check_data_lists_every_broken_utterance(tmp_path, capsys):
    folder = write_wsj(tmp_path)
    argv = ["check-data", "--tasks", "wsj", "--data-root", str(tmp_path), "--workers", "2"]
    assert main(argv) == 0
    assert "wsj: 6 files checked, ok" in capsys.readouterr().out
    garbage, resampled, missing = (folder / "wav" / f"{name}.flac" for name in ("si284_0", "nov93dev_1", "nov92_0"))
    garbage.write_bytes(b"\x00" * 64)
    sf.write(resampled, tone(0.3)[::2], RATE // 2)
    missing.unlink()
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "wsj: 6 files checked, 3 broken" in out
    assert f"BROKEN {garbage}: cannot be decoded as audio" in out
    assert f"BROKEN {resampled}: 8000 Hz, expected 16000 Hz (data.sample_rate)" in out
    assert f"BROKEN {missing}: is missing (listed in the manifest)" in out
