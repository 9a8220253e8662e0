SELECT doc_id, title, start, end, snippet, score FROM EVIDENCE('Hagios Demetrios is located in [MASK].') WHERE phrase = 'Thessaloniki' ORDER BY score DESC LIMIT 20
