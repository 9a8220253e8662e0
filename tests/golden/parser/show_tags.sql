show Tags ;
