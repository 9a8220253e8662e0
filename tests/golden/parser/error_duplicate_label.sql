SELECT label FROM CLASSIFY('[MASK]', LABELS(pos = 'good', pos = 'great'))
