"""Joint sentencepiece subword vocabulary, trained on the training split and cached.

One vocabulary for source and target (fairseq's ``--joined-dictionary``, which ADMIN's WMT
recipes use), so that source, target and output embeddings can be tied. Ids 0-3 are
pad, unk, bos, eos in that order: the model and beam search rely on them.

The vocabulary is a function of the text, sentencepiece's version and the trainer's thread
count, all three measured (stop 43, the tiny en-de corpus, vocabulary 1000): 1, 2, 3 and 4
threads give four different vocabularies, and sentencepiece 0.2.1, 0.2.2 and 0.2.3 give
different ones at equal threads. The thread count is therefore fixed, not taken from the
machine, and the version and thread count are part of the cache key.

No normalisation (``identity``, stop 64): sentencepiece's default ``nmt_nfkc`` rewrites the
training text and every decoded hypothesis in NFKC (``…`` -> ``...``, ``m²`` -> ``m2``, ``½``
-> ``1⁄2``), while BLEU compares the hypotheses with the raw reference lines: a perfect
translation of ``das haus hat 80 m² , sagte er …`` scored 39.1 BLEU. The tiny corpora are
NFKC-invariant (every sentence of both), so their vocabularies are the same either way.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

PAD, UNK, BOS, EOS = 0, 1, 2, 3

#: sentencepiece's trainer threads: fixed, so that every machine trains the same vocabulary.
#: Two is what the tiny matrix's wmt14 records were trained with (a 2-core machine, when the
#: count was min(4, cpu_count)); more would only shorten a one-off, cached training.
TRAINER_THREADS = 2

#: sentencepiece's text normalisation: none, so that hypotheses are in the references' characters
NORMALIZATION = "identity"


class SubwordTokenizer:
    def __init__(self, model_file: Path) -> None:
        import sentencepiece as spm

        self.model_file = model_file
        self.sp = spm.SentencePieceProcessor(model_file=str(model_file))

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.sp.encode(list(texts))

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        # Cut at the first eos and drop specials: beam search pads finished hypotheses.
        clean = []
        for seq in ids:
            seq = list(seq)
            if EOS in seq:
                seq = seq[: seq.index(EOS)]
            clean.append([i for i in seq if i > EOS])
        return self.sp.decode(clean)


def train_tokenizer(
    texts: Sequence[str], vocab_size: int, cache_dir: Path, max_sentences: int = 2_000_000
) -> SubwordTokenizer:
    """Train (or reuse) a unigram sentencepiece model on ``texts``; cached by the content, the
    vocabulary size, sentencepiece's version and the thread count (module doc)."""
    import sentencepiece as spm

    settings = f"sentencepiece {spm.__version__}, {TRAINER_THREADS} threads, normalization {NORMALIZATION}\n"
    digest = hashlib.sha1(settings.encode())
    for text in texts:
        digest.update(text.encode("utf-8") + b"\n")
    key = f"spm-{vocab_size}-{digest.hexdigest()[:12]}"
    model_file = cache_dir / f"{key}.model"
    if not model_file.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
            corpus = Path(tmp) / "corpus.txt"
            corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
            spm.SentencePieceTrainer.train(
                input=str(corpus),
                model_prefix=str(Path(tmp) / key),
                vocab_size=vocab_size,
                model_type="unigram",
                character_coverage=1.0,
                normalization_rule_name=NORMALIZATION,
                pad_id=PAD,
                unk_id=UNK,
                bos_id=BOS,
                eos_id=EOS,
                input_sentence_size=max_sentences,
                shuffle_input_sentence=True,
                # A tiny corpus may not support the requested size: cap it instead of failing.
                hard_vocab_limit=False,
                num_threads=TRAINER_THREADS,
                minloglevel=2,
            )
            # Rename last: concurrent cells either see the whole model or train their own.
            os.replace(Path(tmp) / f"{key}.model", model_file)
    return SubwordTokenizer(model_file)
