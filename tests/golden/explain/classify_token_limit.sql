SELECT label, score, support FROM CLASSIFY('The movie was [MASK].', LABELS(positive = 'great', negative = 'terrible')) USING exact WITH mode = token, tau = 2 WHERE score > 0 LIMIT 1
