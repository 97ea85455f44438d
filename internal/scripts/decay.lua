-- decay.lua: the decay every EWMA script shares, written once and spliced
-- into ewma.lua and ewma1.lua at their include line for it (package
-- scripts, include). It reads the local ldexp (math.ldexp) of the script
-- it is spliced into.
--
-- decay returns score s written at ms t, seen at ms now, under half-life p
-- ms: s * 2^-x with x = (now - t)/p, as ratelimit.decayAt does in Go, and
-- bit for bit the same: 2^-x is computed by the steps of Go's own exp2
-- (argument reduction to |k - x| <= 1/2, its polynomial, ldexp), each an
-- IEEE double operation that Lua and Go (ratelimit.exp2neg, which forbids
-- fused multiply-adds) both round the same way. Not Lua's 2^-x: that is C
-- pow, which differs from Go's math.Exp2 in the last bit for about one x
-- in eight (TestPowIsNotExp2), and a last bit decides an admission at an
-- exact boundary. The admission test and the wait search both use this one
-- function, so they cannot disagree.
local function decay(s, t, now, p)
  if now <= t then
    return s -- a score never decays for time that has not passed
  end
  local x = (now - t) / p
  if x > 1074 then
    return 0 -- 2^-x is below half the smallest double (Go's exp2 says 0 too)
  end
  local k = x + 0.5
  k = k - k % 1 -- floor(x + 0.5), exactly, without a call
  local u = k - x
  local hi, lo = u * 6.93147180369123816490e-01, -u * 1.90821492927058770002e-10
  local r = hi - lo
  local q = r * r
  local c = r - q * (1.66666666666666657415e-01 + q * (-2.77777777770155933842e-03 + q * (6.61375632143793436117e-05 + q * (-1.65339022054652515390e-06 + q * 4.13813679705723846039e-08))))
  return s * ldexp(1 - ((lo - r * c / (2 - c)) - hi), -k)
end
