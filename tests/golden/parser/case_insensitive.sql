SeLeCt Phrase FrOm MaSkEd('[MASK]') UsInG HyBrId(K => 1) WiTh TAU = 1 WhErE NoT x Is NuLl OrDeR bY Score dEsC LiMiT 1
