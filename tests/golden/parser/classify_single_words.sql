SELECT label, score FROM CLASSIFY('It was [MASK].', LABELS(positive = 'great', negative = ('terrible'), 'very bad' = 'awful', "Mixed" = (?, :w)))
