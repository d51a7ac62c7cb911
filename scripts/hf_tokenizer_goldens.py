#!/usr/bin/env python3
"""Goldens for kvx's tokenizer.json reader (plugins/model/tok), made by Hugging Face `tokenizers`.

Usage: python3 scripts/hf_tokenizer_goldens.py OUTDIR

Builds small tokenizers from scratch (no downloads, no network): each is trained
on the corpus below with the pre-tokenizer, normalizer, decoder and
post-processor of a real family, then saved as OUTDIR/<name>/tokenizer.json
next to OUTDIR/<name>/expected.json, which holds what `tokenizers` itself
gives for the tricky strings below:

  {"name": .., "tokenizers_version": .., "vocab_size": get_vocab_size(with_added_tokens=True),
   "cases": [{"text": .., "ids": encode(text, add_special_tokens=False),
              "ids_special": encode(text, add_special_tokens=True),
              "decoded": decode(ids), "decoded_skip": decode(ids, skip_special_tokens=True)}, ..],
   "decode_cases": [{"ids": [..], "decoded": .., "decoded_skip": ..}, ..]}

decode_cases are seeded random id sequences (cut UTF-8, byte-fallback tokens,
special tokens among text). The tokenizers:

  llama3      Split(Llama-3 regex, Isolated) + ByteLevel(use_regex=False), BPE with
              ignore_merges, <|begin_of_text|> added by TemplateProcessing
  gpt2        ByteLevel (its own regex), BPE; added tokens with lstrip / rstrip /
              single_word / normalized
  qwen2       NFC + Split(Qwen2 regex: single digits) + ByteLevel, no BOS
  spm         Llama-2 / Mistral style: Metaspace(prepend_scheme=first, split=False),
              BPE with byte_fallback + fuse_unk, Replace/ByteFallback/Fuse/Strip decoder, <s>
  spm_legacy  the same model with the legacy Prepend("▁") + Replace(" ", "▁") normalizer
  spm_mdec    the spm model with the Metaspace decoder
  unigram     a Unigram model (T5 / ALBERT style) with Metaspace

Go's tests (go test ./plugins/model/tok/) read them from plugins/model/testdata/tokenizers/.
"""

import json
import os
import random
import sys
import traceback

LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

CORPUS = """
The quick brown fox jumps over the lazy dog. The dog doesn't mind; it's lazy and it'll sleep.
We've seen 12 foxes, 345 dogs and 67890 cats in 2024 and 2025. Prices: $3.14, $1,000,000 and 42%.
I'm sure you'd like it. They're here, aren't they? She's gone, he'll stay, we'd better go.
def tokenize(text):
    return [t for t in text.split() if t]  # comments matter
for (int i = 0; i < n; i++) { sum += a[i] * b[i]; }
Hello, world! Hello world. hello WORLD. HELLO, World?
naïve café résumé façade jalapeño über straße
Ελληνικά γράμματα και Русский язык и українська мова
日本語のテキストと中文的文本，还有한국어 텍스트。
Emoji: 😀 😃 👍 🎉 ❤️ and more 😀😀😀
    indented line
\t\ttabbed line
line one
line two

paragraph after a blank line
https://example.com/path?query=value&other=1 someone@example.org
""".strip()

TEXTS = [
    "",
    "Hello world",
    "Hello, world!",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "double  space and   triple",
    "tabs\tand\t\ttabs",
    "line\nbreak",
    "two\n\nnewlines",
    "spaces before newline   \n  and after",
    "\n\n\n",
    "   ",
    " ",
    "I'm can't won't they'll we've you'd she's",
    "I'M CAN'T THEY'LL WE'VE",
    "numbers 1 12 123 1234 12345 1234567890",
    "3.14159 and -42 and 1,000,000 and 2025-12-01",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flag 🇯🇵",
    "日本語のテキスト",
    "中文测试，标点。",
    "Ελληνικά και Русский",
    "naïve café résumé",
    "combining e\u0301 vs \u00e9",
    "\ufb01 ligature and \uff21\uff22\uff23 fullwidth",
    "code:\ndef f(x):\n    return x**2  # square\n",
    "<|begin_of_text|>Hello",
    "text <|end_of_text|> more",
    "<|begin_of_text|><|begin_of_text|>",
    "a<|eot_id|>b",
    "<|begin_of_text",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<s>Hello</s> <s> x</s>",
    "<unk> and <0x41> as text",
    "mixed 123abc abc123 a1b2c3",
    "punctuation!!! ??? ... --- ;;",
    "url https://example.com/a?b=c&d=e",
    "\u00a0non-breaking\u00a0space",
    "\u3000ideographic space",
    "zero\u200bwidth",
    "\r\nwindows\r\nlines\r\n",
    "a" * 40 + " " * 17 + "b",
    "the quick brown fox jumps over the lazy dog " * 3,
    "'s 'S 'll 'LL",
    "\u017f long s and \u212a kelvin",
    "x <mask> y<mask>z <mask>",
    "[X] after [X]  twice [X]",
    "wordy word wordword",
    "<extra> and<extra>",
]


def die(msg):
    sys.exit("hf_tokenizer_goldens.py: " + msg)


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        die("usage: python3 scripts/hf_tokenizer_goldens.py OUTDIR")
    out = sys.argv[1]
    try:
        import tokenizers
    except ImportError as e:
        die(f"needs the Hugging Face `tokenizers` package (pip install tokenizers; transformers depends on it): {e}")
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    lines = CORPUS.splitlines() * 20

    def bpe(**kw):
        try:
            return models.BPE(**kw)
        except TypeError:  # an older tokenizers without ignore_merges
            kw.pop("ignore_merges", None)
            return models.BPE(**kw)

    def train(tok, vocab_size, **kw):
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False, **kw)
        tok.train_from_iterator(lines, trainer=trainer)

    def byte_level(name, pre, normalizer=None, ignore_merges=False, specials=(), bos=None, added=()):
        tok = Tokenizer(bpe(ignore_merges=ignore_merges))
        if normalizer is not None:
            tok.normalizer = normalizer
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        train(tok, 700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
        if added:
            tok.add_tokens(list(added))
        post = [processors.ByteLevel(trim_offsets=False)]
        if bos is not None:
            post.append(processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]))
        try:
            tok.post_processor = processors.Sequence(post)
        except AttributeError:
            tok.post_processor = post[-1]
        return name, tok

    # Each tokenizer is built alone: one that this tokenizers version cannot
    # build is reported and the others are still written.
    builders = [
        lambda: byte_level("llama3", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]), ignore_merges=True, specials=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], bos="<|begin_of_text|>"),
        lambda: byte_level("gpt2", pre_tokenizers.ByteLevel(add_prefix_space=False), specials=["<|endoftext|>"], added=[
            AddedToken("<mask>", lstrip=True, special=False, normalized=False),
            AddedToken("[X]", rstrip=True, special=False, normalized=False),
            AddedToken("word", single_word=True, special=False, normalized=False),
            AddedToken("<extra>", special=False, normalized=True),
        ]),
        lambda: byte_level("qwen2", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]), normalizer=normalizers.NFC(), specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
    ]
    def unigram():
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>", show_progress=False)
        tok.train_from_iterator(lines, trainer=trainer)
        return "unigram", tok

    builders.append(unigram)
    failed = []
    built = []
    for i, b in enumerate(builders):
        try:
            built.append(b())
        except Exception:
            traceback.print_exc()
            failed.append(f"byte-level tokenizer {i}")
    try:
        built += spm_family(json, Tokenizer, AddedToken, models, normalizers, pre_tokenizers, decoders, processors, trainers, lines)
    except Exception:
        traceback.print_exc()
        failed.append("spm family")

    for name, tok in built:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "tokenizer.json")
        tok.save(path)
        tok = Tokenizer.from_file(path)  # the goldens are those of the saved file
        cases = []
        for text in TEXTS:
            ids = tok.encode(text, add_special_tokens=False).ids
            cases.append({
                "text": text,
                "ids": ids,
                "ids_special": tok.encode(text, add_special_tokens=True).ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip": tok.decode(ids, skip_special_tokens=True),
            })
        rng = random.Random(13)
        n = tok.get_vocab_size(with_added_tokens=True)
        dcases = []
        for _ in range(40):
            ids = [rng.randrange(n) for _ in range(rng.randint(1, 8))]
            dcases.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                           "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
        with open(os.path.join(d, "expected.json"), "w") as f:
            json.dump({"name": name, "tokenizers_version": tokenizers.__version__, "vocab_size": n,
                       "cases": cases, "decode_cases": dcases}, f, indent=1)
            f.write("\n")
        print(f"{d}: vocab {n}, {len(cases)} cases, {len(dcases)} decode cases")
    if failed:
        die("failed to build: " + ", ".join(failed) + " (tracebacks above); the others are written")


def spm_family(json, Tokenizer, AddedToken, models, normalizers, pre_tokenizers, decoders, processors, trainers, lines):
    """Llama-2 / Mistral style: <unk> <s> </s>, then <0x00>..<0xFF> in the model's vocab, then the merges' tokens."""
    try:
        meta = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    except TypeError:
        meta = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = meta
    trainer = trainers.BpeTrainer(vocab_size=500, min_frequency=2, show_progress=False, limit_alphabet=120,
                                  special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(lines, trainer=trainer)
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    specials = {"<unk>", "<s>", "</s>"}
    assert all(vocab[s] < 3 for s in specials), vocab
    shifted = {}
    for t, i in vocab.items():
        shifted[t] = i if t in specials else i + 256
    for b in range(256):
        shifted[f"<0x{b:02X}>"] = 3 + b
    d["model"]["vocab"] = shifted
    d["model"].update(unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    for a in d["added_tokens"]:
        a["id"] = shifted[a["content"]]

    def as_json(field, value):
        """The JSON tokenizers writes for a component, through a throwaway tokenizer."""
        t = Tokenizer(models.BPE())
        setattr(t, field, value)
        return json.loads(t.to_str())[field]

    d["decoder"] = as_json("decoder", decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0),
    ]))
    d["post_processor"] = as_json("post_processor", processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", shifted["<s>"])]))
    spm = Tokenizer.from_str(json.dumps(d))

    legacy = dict(d)
    legacy["pre_tokenizer"] = None
    legacy["normalizer"] = as_json("normalizer", normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]))
    mdec = dict(d)
    mdec["decoder"] = as_json("decoder", decoders.Metaspace(replacement="▁", prepend_scheme="first"))
    return [("spm", spm), ("spm_legacy", Tokenizer.from_str(json.dumps(legacy))), ("spm_mdec", Tokenizer.from_str(json.dumps(mdec)))]


if __name__ == "__main__":
    main()
