SELECT phrase, doc_id, title, start, "end", snippet, score FROM EVIDENCE('Hagios Demetrios is located in [MASK].') WHERE phrase LIKE 'T%' AND title LIKE 'S%' AND score > 0.01 ORDER BY doc_id LIMIT 3
