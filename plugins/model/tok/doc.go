// Package tok reads a Hugging Face tokenizer.json and encodes text to token
// ids and decodes ids to text as the Hugging Face `tokenizers` library does,
// for the kinds that LLM checkpoints ship:
//
//   - byte-level BPE (GPT-2, Llama-3, Qwen2/3, DeepSeek-V3): a ByteLevel or
//     Split(regex) + ByteLevel pre-tokenizer, a BPE model with vocab and
//     merges (ignore_merges honoured), the ByteLevel decoder;
//   - SentencePiece-style BPE (Llama-2, Mistral): Metaspace, or the legacy
//     Prepend + Replace normalizers, a BPE model with byte_fallback and
//     fuse_unk, the Replace/ByteFallback/Fuse/Strip decoder chain;
//   - Unigram (T5, ALBERT): Viterbi over the piece scores, unknown
//     characters fused into one unk, byte_fallback;
//   - added tokens (special or not), matched leftmost-longest before any
//     splitting, with lstrip, rstrip, single_word and normalized;
//   - the TemplateProcessing post-processor (a BOS such as
//     <|begin_of_text|>) for EncodeSpecial.
//
// Its parts and the failure each prevents:
//
//   - regex.go translates the pre-tokenizer's Oniguruma pattern to Go's
//     regexp: \s, \d, \w are Unicode there and ASCII in Go, and Go has no
//     lookahead, so the `\s+(?!\S)|\s+` that ends every GPT-style pattern is
//     matched as `\s+` and shortened by one character when a non-space
//     follows (the space then leads the next word, as " world" in GPT-2).
//     Any other lookaround is refused at load, never silently mis-split.
//   - unigram.go is tokenizers' Unigram::encode_optimized: ties go to the
//     piece that starts first, so equal scores segment the same way.
//   - bpe.go merges by rank, lowest first and leftmost among equals, as
//     `tokenizers`' Word::merge_all does (a heap, so a long run of spaces
//     is not quadratic).
//   - decode.go decodes bytes to text with the U+FFFD rule of Rust's
//     String::from_utf8_lossy (one per maximal invalid subsequence), so a
//     completion cut inside a character reads as Hugging Face prints it.
//
// Not here: the chat template (tokenizer_config.json), WordPiece and
// WordLevel models, pair encodings, truncation, padding and offsets. Loading a
// file that needs one of them fails with an error naming the kind.
//
// A *Tokenizer is immutable after Load and safe for concurrent use.
package tok
