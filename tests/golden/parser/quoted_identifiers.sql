SELECT "end", "order", "a ""b""", doc."my key" FROM EVIDENCE('[MASK]') WHERE doc.meta.order = 1 AND "select" = 2
