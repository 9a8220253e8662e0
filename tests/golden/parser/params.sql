SELECT phrase FROM MASKED(?) AS OF ? USING bm25(blocks => ?) WITH tau = :tau WHERE score > ? AND phrase != :avoid LIMIT ? OFFSET :off
