"""Translation: the Translator and what it is made of.

translator.py   Translator (load once; translate, translate_batch, translate_ids, score)
loading.py      a checkpoint's model and tokenizers (load_for_inference, load_ensemble)
generator.py    SequenceGenerator: batched beam search / sampling on the KV-cached decoder
search.py       the search step on log-probs (candidates, top-k, selection)
processors.py   the search's rules as logit processors (penalties, lengths, prefixes, sampling)
constraints.py  lexical constraints: required phrases' beam allocation, banned phrases
banned.py       exclude phrases as every spelling in target pieces the search must ban
forced.py       forced decoding: the log-probs of a given target
encoding.py     text <-> ids, length-sorted batches, padding, pieces, alignments
shortlist.py    decoding over a batch's shortlist candidates (BatchVocab)
config.py       SearchConfig, GenerateConfig
job.py          nmt-generate's streaming job: sources, batches, throughput, BLEU
io.py           nmt-generate's inputs, output formats and output file
chunks.py       one chunk of input lines -> its formatted output (workers=1 and workers=N)
workers.py      nmt-generate workers=N: chunks translated by spawned processes, in order
workfolder.py   <output>.parts/: finished chunks and their manifest, for resuming a run
terminology.py  constraints and glossaries as text: parsing, files, glossary matching
tagging.py      a multilingual model's tgt_lang/src_lang as each sentence's tag ids
langfile.py     nmt-generate's tgt_lang_file=: one target language per input line
"""
