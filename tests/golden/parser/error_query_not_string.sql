SELECT phrase FROM MASKED(phrase)
