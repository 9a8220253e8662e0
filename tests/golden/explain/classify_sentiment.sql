SELECT label, score FROM CLASSIFY('... It was [MASK].', LABELS(positive = ('great', 'awesome'), negative = ('terrible', 'broken')))
