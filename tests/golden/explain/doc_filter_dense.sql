SELECT phrase, score, doc_id, title FROM MASKED('Hagios Demetrios is located in [MASK].') USING dense WHERE doc.title IN ('springboard', 'intifada') AND length(phrase) <= 3 LIMIT 5
