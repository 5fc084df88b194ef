"""Special token ids, fixed for every nmt vocabulary (fairseq's order).

SentencePiece models are trained with exactly these ids, so a SentencePiece id is the
model's id: no separate vocabulary mapping exists anywhere in nmt. It lives in the
foundation, below the data and the model, which both use these ids.
"""

BOS = 0  # <s>
PAD = 1  # <pad>
EOS = 2  # </s>; also the first input symbol of the decoder, as in fairseq
UNK = 3  # <unk>

SPECIAL_IDS = {"bos": BOS, "pad": PAD, "eos": EOS, "unk": UNK}
