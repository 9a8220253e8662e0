SELECT doc_id, title, snippet, score FROM SEARCH('byzantine church') WHERE doc.title NOT LIKE '%list%' LIMIT 10
