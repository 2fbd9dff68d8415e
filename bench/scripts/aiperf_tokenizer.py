"""Build an offline word-level tokenizer for AIPerf (run with the AIPerf venv's Python).

    python aiperf_tokenizer.py OUT_DIR

AIPerf counts tokens with a Hugging Face tokenizer, which it would otherwise
download (`--tokenizer builtin` downloads tiktoken's o200k_base file on first
use). infergate's mock and `infergate-bench bench` both count one token per
whitespace-separated word, so the fair tokenizer for a cross-check is a
word-level one: one token per word, over the words of AIPerf's own prompt
corpus (Shakespeare) plus the mock's 64 output words. It is written as a
`tokenizer.json` + `tokenizer_config.json` directory that
`transformers.AutoTokenizer` loads from a local path, with no network.
"""

import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

import aiperf

# bench/mock/completion.go's vocabulary: every output token of the mock.
MOCK_WORDS = """alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima
mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu
amber basalt cobalt dune ember fjord granite harbor island jasper kelp lagoon meadow nectar
orchid pebble quartz river saffron tundra umber valley willow yarrow zephyr anchor beacon
canyon drift estuary forest glacier horizon inlet jetty knoll lantern mesa""".split()


def main(out):
    corpus = os.path.join(os.path.dirname(aiperf.__file__), "dataset", "generator", "assets", "shakespeare.txt")
    words = set(MOCK_WORDS)
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            words.update(line.split())
    vocab = {"[UNK]": 0}
    for w in sorted(words):
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]",
                   "model_max_length": 1 << 30, "clean_up_tokenization_spaces": False}, f, indent=1)
    print(f"{out}: word-level tokenizer, {len(vocab)} words", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
