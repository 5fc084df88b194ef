"""nmt's benchmarks, one module each, run from the repository root:

    .venv/bin/python -m benchmarks.<name> [options] [--json FILE]

    suite             preprocess, train and generate figures in one table, each measured
                      in a subprocess of its own (peak memory included)
    preprocess        nmt.data.build_data_dir: encode + binarize pairs/s
    train             training target tokens/s, model FLOP/s and MFU, fp32 and bf16 in
                      turns
    generate          beam search sentences/s and tokens/s, with and without the KV cache
    decoder           one beam-search-shaped decoder step, cached and uncached
    ctranslate2       nmt against CTranslate2 on the same exported weights
    fairseq_generate  nmt-generate against fairseq-generate on the same weights (a peer)
    train_paired      training speed of the working tree against a git revision,
                      interleaved in one process
    generate_paired   beam search speed of the working tree against a git revision,
                      interleaved in one process
    serve             nmt-serve under load (1-32 clients) against offline nmt-generate
    serve_memory      fp32 CPU translation's memory and speed under a mix of batch shapes,
                      for each way of bounding oneDNN's per-shape kernels
    scale             nmt-preprocess and nmt-train start-up on 1M-10M pairs
    make_corpus       a synthetic parallel corpus of any size (for scale and tests)

`benchmarks.common` is the one shared helper: timing, repeats, the machine, the JSON
report every benchmark writes with --json, Markdown tables, and paired runs. Figures and
how to read them: docs/results.md.
"""
