"""Translation: the Translator and what it is made of.

translator.py  Translator (load once; translate, translate_batch, translate_ids, score)
generator.py   SequenceGenerator: batched beam search / sampling on the KV-cached decoder
search.py      the search step on log-probs (candidates, top-k, selection)
processors.py  the search's rules as logit processors (penalties, lengths, prefixes, sampling)
forced.py      forced decoding: the log-probs of a given target
encoding.py    text <-> ids, length-sorted batches, padding, pieces, alignments
config.py      SearchConfig, GenerateConfig
job.py io.py   nmt-generate's streaming job: inputs, output formats, the output file
"""
