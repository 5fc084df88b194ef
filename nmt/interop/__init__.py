"""Other toolkits' models: export to CTranslate2, import from fairseq.

config.py              ExportConfig (nmt-export), ImportFairseqConfig (nmt-import-fairseq)
ctranslate2_export.py  an nmt checkpoint -> a CTranslate2 model directory (ctranslate2 needed)
fairseq_import.py      a fairseq transformer checkpoint -> an nmt checkpoint
fairseq_languages.py   a fairseq multilingual model's language tokens as nmt's tags
safe_unpickle.py       reading another toolkit's pickle without running its code
"""
