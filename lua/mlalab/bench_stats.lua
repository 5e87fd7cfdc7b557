--- Statistics of the bench harness: summaries, NVBench's stopping criterion,
-- and the A/B verdict (order-statistic intervals + Mann-Whitney).
local S = {}

--- S.mean(x) -> the arithmetic mean of an array of numbers.
function S.mean(x)
  local s = 0
  for i = 1, #x do s = s + x[i] end
  return #x > 0 and s / #x or nil
end

local function sorted(x)
  local c = table.move(x, 1, #x, 1, {})
  table.sort(c)
  return c
end

--- Quantile q of a sorted array, linear interpolation between order statistics.
function S.quantile(s, q)
  local n = #s
  if n == 0 then return nil end
  local h = (n - 1) * q + 1
  local lo = math.floor(h)
  local hi = math.min(n, lo + 1)
  return s[lo] + (h - lo) * (s[hi] - s[lo])
end

--- median, q1, q3, min, max, mean, stdev (Bessel), noise = stdev / mean
function S.summary(x)
  local s = sorted(x)
  local n = #s
  local mean = S.mean(s)
  local m2 = 0
  for i = 1, n do m2 = m2 + (s[i] - mean) ^ 2 end
  local stdev = n > 1 and math.sqrt(m2 / (n - 1)) or 0
  return {
    median = S.quantile(s, 0.5), q1 = S.quantile(s, 0.25), q3 = S.quantile(s, 0.75), min = s[1], max = s[n],
    mean = mean, stdev = stdev, noise = mean > 0 and stdev / mean or nil,
  }
end

--- NVBench's stdrel criterion: relative stdev (Bessel) from 5 samples on,
-- kept in a 512-entry ring; done when the measured time exceeds min_time and
-- the latest noise is under max_noise, or (plateau) when, past 64 estimates
-- and every 16 samples, the noise estimates vary by less than 5 %.
function S.stdrel(o)
  local c = { n = 0, mean = 0, m2 = 0, ring = {}, count = 0, invalid = 0 }
  function c:add(x)
    self.n = self.n + 1
    local d = x - self.mean
    self.mean = self.mean + d / self.n
    self.m2 = self.m2 + d * (x - self.mean)
    if self.n < 5 then return end
    local noise = math.sqrt(self.m2 / (self.n - 1)) / self.mean
    if noise == noise and noise ~= math.huge then
      self.invalid = 0
      self.count = self.count + 1
      self.ring[(self.count - 1) % 512 + 1] = noise
      self.last = noise
    else
      self.invalid = self.invalid + 1
    end
  end
  function c:finished()
    if self.invalid >= 64 then return true, "invalid-noise" end
    if self.mean * self.n <= o.min_time then return false end
    if not self.last or self.invalid > 0 then return false end
    if self.last < o.max_noise then return true, "converged" end
    if o.plateau and self.count > 64 and self.n % 16 == 0 then
      local m = S.mean(self.ring)
      local v = 0
      for _, x in ipairs(self.ring) do v = v + (x - m) ^ 2 end
      v = v / (#self.ring - 1)
      if v < (m * 0.05) ^ 2 then return true, "plateau" end
    end
    return false
  end
  return c
end

-- A/B ----------------------------------------------------------------------------

--- erfc for x >= 0 (Chebyshev fit, relative error < 1.2e-7)
local function erfc(x)
  local t = 1 / (1 + 0.5 * x)
  return t * math.exp(-x * x - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
    + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
end

--- Mann-Whitney U (normal approximation, tie-corrected). Returns the
-- two-sided p-value and P(b < a) (+ half the ties).
function S.mann_whitney(a, b)
  local na, nb = #a, #b
  local all = {}
  for i = 1, na do all[i] = { a[i], 0 } end
  for j = 1, nb do all[na + j] = { b[j], 1 } end
  table.sort(all, function(x, y) return x[1] < y[1] end)
  local N, rb, ties = na + nb, 0, 0
  local i = 1
  while i <= N do
    local j = i
    while j < N and all[j + 1][1] == all[i][1] do j = j + 1 end
    local rank = (i + j) / 2
    local t = j - i + 1
    if t > 1 then ties = ties + t ^ 3 - t end
    for k = i, j do
      if all[k][2] == 1 then rb = rb + rank end
    end
    i = j + 1
  end
  local ub = rb - nb * (nb + 1) / 2 -- pairs with b > a
  local mu = na * nb / 2
  local var = na * nb / 12 * ((N + 1) - ties / (N * (N - 1)))
  local p = 1
  if var > 0 then p = erfc(math.abs(ub - mu) / math.sqrt(var) / math.sqrt(2)) end
  return math.min(1, p), 1 - ub / (na * nb)
end

--- Distribution-free interval of the median from order statistics.
function S.median_interval(x, z)
  local s = sorted(x)
  local n = #s
  local h = z * math.sqrt(n) / 2
  local lo = math.max(1, math.floor(n / 2 - h))
  local hi = math.min(n, math.ceil(n / 2 + 1 + h))
  return s[lo], s[hi], S.quantile(s, 0.5)
end

local AB = {}
AB.__index = AB

function AB:row()
  return string.format("%-8s %s vs %s: %.4gx time (%s %.4g..%.4g), speedup %.3fx, Mann-Whitney p=%.2g, P(b<a)=%.2f%s",
    self.verdict:upper(), self.b_name, self.a_name, self.ratio, "interval", self.lo, self.hi, self.speedup, self.p,
    self.p_b_faster, #self.notes > 0 and "  [" .. table.concat(self.notes, "; ") .. "]" or "")
end
AB.__tostring = AB.row

local function samples_of(x, what)
  if type(x) == "table" and x.samples then return x.samples, x end
  if type(x) == "table" then return x, {} end
  error("ab: " .. what .. " must be a bench result or an array of times", 3)
end

--- S.ab(a, b, {threshold = 0.005, alpha = 0.01, z}) -> verdict of b against a (mla.ab): the ratio of medians
-- with its interval from order statistics, Mann-Whitney's p, and "faster" / "slower" / "same" / "unclear".
function S.ab(a, b, opts)
  opts = opts or {}
  local sa, ra = samples_of(a, "a")
  local sb, rb = samples_of(b, "b")
  local thr = opts.threshold or 0.005
  local alpha = opts.alpha or 0.01
  local z = opts.z or 2.241 -- 97.5 % per median, so the ratio interval holds with >= 95 %
  local r = setmetatable({ a_name = ra.name or "a", b_name = rb.name or "b", threshold = thr, alpha = alpha,
    na = #sa, nb = #sb, notes = {} }, AB)
  if #sa < 5 or #sb < 5 then
    r.verdict, r.ratio, r.lo, r.hi, r.speedup, r.p, r.p_b_faster = "unclear", 0 / 0, 0 / 0, 0 / 0, 0 / 0, 1, 0.5
    r.notes[1] = "fewer than 5 samples"
    return r
  end
  local alo, ahi, amed = S.median_interval(sa, z)
  local blo, bhi, bmed = S.median_interval(sb, z)
  r.ratio, r.lo, r.hi = bmed / amed, blo / ahi, bhi / alo
  r.speedup = amed / bmed
  r.p, r.p_b_faster = S.mann_whitney(sa, sb)
  local v
  if r.hi < 1 - thr and r.p < alpha then v = "faster"
  elseif r.lo > 1 + thr and r.p < alpha then v = "slower"
  elseif r.lo >= 1 - thr and r.hi <= 1 + thr then v = "same"
  else v = "unclear" end
  -- NVBench's cycle-space confirmation: a gap explained by different clocks is no gap
  if ra.clock_mhz and rb.clock_mhz then
    local k = rb.clock_mhz / ra.clock_mhz
    r.cycle_ratio = r.ratio * k
    if math.abs(k - 1) > 0.02 then
      r.notes[#r.notes + 1] = string.format("SM clocks differ: %.0f vs %.0f MHz", ra.clock_mhz, rb.clock_mhz)
    end
    if (v == "faster" and r.hi * k >= 1 - thr) or (v == "slower" and r.lo * k <= 1 + thr) then
      r.notes[#r.notes + 1] = "the time gap is not confirmed in cycles"
      v = "unclear"
    end
  end
  r.verdict = v
  return r
end

return S
