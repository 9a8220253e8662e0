SELECT doc_id, title, score, snippet FROM SEARCH('byzantine church') WHERE title LIKE 'B%' AND score > 1 LIMIT 10 OFFSET 5
