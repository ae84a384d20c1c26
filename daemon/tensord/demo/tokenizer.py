"""The demo generator's tokenizer: byte-level BPE trained here on a seeded corpus.

The corpus mixes common English words with made-up words built from syllables, in
sentences with capitals, commas, digits and full stops, so that ordinary English prompts
split into whole-word tokens and anything else still encodes (byte-level: every byte
string has a tokenization). Training takes well under a second.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)  # ids 0, 1, 2

_ENGLISH = """
the of and to a in is it you that he was for on are with as his they be at one have this
from or had by hot word but what some we can out other were all there when up use your how
said an each she which do their time if will way about many then them write would like so
these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work
part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here must big
high such follow act why ask men change went light kind off need house picture try us again
animal point mother world near build self earth father head stand own page should country
found answer school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea draw left late
run while press close night real life few north open seem together next white children begin
got walk example ease paper group always music those both mark often letter until mile river
car feet care second book carry took science eat room friend began idea fish mountain stop
once base hear horse cut sure watch color face wood main enough plain girl usual young ready
above ever red list though feel talk bird soon body dog family direct pose leave song measure
door product black short numeral class wind question happen complete ship area half rock
order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb
sing listen six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern pull cold notice
voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star
box noun field rest correct able pound done beauty drive stood contain front teach week final
gave green oh quick develop ocean warm free minute strong special mind behind clear tail
produce fact street inch multiply nothing course stay wheel full force blue object decide
surface deep moon island foot system busy test record boat common gold possible plane stead
dry wonder laugh thousand ago ran check game shape equate miss brought heat snow tire bring
yes distant fill east paint language among fox lazy jumps brown model token stream engine
"""

_ONSETS = (
    "b",
    "br",
    "c",
    "ch",
    "d",
    "f",
    "g",
    "gr",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "pl",
    "qu",
    "r",
    "s",
    "sh",
    "st",
    "t",
    "th",
    "tr",
    "v",
    "w",
    "z",
)
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "y")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "nd", "st", "ng", "x")


def _made_up_words(rng: np.random.Generator, count: int) -> list[str]:
    words: set[str] = set()
    while len(words) < count:
        syllables = int(rng.integers(1, 4))
        words.add(
            "".join(
                _ONSETS[rng.integers(len(_ONSETS))]
                + _VOWELS[rng.integers(len(_VOWELS))]
                + _CODAS[rng.integers(len(_CODAS))]
                for _ in range(syllables)
            )
        )
    return sorted(words)


def build_corpus(seed: int = 0, num_words: int = 6000) -> list[str]:
    """Seeded sentences, about `num_words` words in all, one sentence per string."""
    rng = np.random.default_rng(seed)
    lexicon = sorted(set(_ENGLISH.split())) + _made_up_words(rng, 600)
    # Zipf-like frequencies: a few words common, most rare, as in real text.
    weights = 1.0 / np.arange(1, len(lexicon) + 1) ** 0.8
    order = rng.permutation(len(lexicon))
    probs = weights[order] / weights.sum()
    sentences, total = [], 0
    while total < num_words:
        length = int(rng.integers(4, 16))
        words = [lexicon[i] for i in rng.choice(len(lexicon), size=length, p=probs)]
        if rng.random() < 0.15:
            words[int(rng.integers(length))] = str(int(rng.integers(0, 2000)))
        if rng.random() < 0.3:
            words[int(rng.integers(length - 1))] += ","
        words[0] = words[0].capitalize()
        sentences.append(" ".join(words) + str(rng.choice([".", ".", ".", "?", "!"])))
        total += length
    return sentences


def build_tokenizer(vocab_size: int = 2048, seed: int = 0) -> Tokenizer:
    """A byte-level BPE tokenizer with <pad>=0, <s>=1 (added before every prompt), </s>=2."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = build_corpus(seed)
    tokenizer.train_from_iterator(corpus, trainer=trainer, length=len(corpus))
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer
