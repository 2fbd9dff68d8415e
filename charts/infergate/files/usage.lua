local function blank(l) return l == "\n" or l == "\r\n" end
local function usage(l)
  return #l <= 8192 and l:sub(1, 5) == "data:" and l:find('"usage"%s*:%s*{') ~= nil
    and l:find('"choices"%s*:%s*%[%s*%]') ~= nil
end
function envoy_on_response(h)
  local m = h:streamInfo():dynamicMetadata():get("infergate")
  if m == nil or m.usage_added ~= true then return end
  local held, pending, passing, mid = "", "", false, false
  for chunk in h:bodyChunks() do
    local s = chunk:getBytes(0, chunk:length())
    if held == "" and pending == "" and not passing and s:sub(-1) == "\n"
        and not s:find('"usage"%s*:%s*{') then
      mid = not (s == "\n" or s == "\r\n" or s:sub(-2) == "\n\n" or s:sub(-3) == "\n\r\n")
    else
      local out, pos, n = {}, 1, #s
      while pos <= n do
        local e = s:find("\n", pos, true)
        if passing then
          out[#out + 1] = s:sub(pos, e or n)
          if e then passing, mid = false, true end
          pos = (e or n) + 1
        elseif e == nil then
          held, pos = held .. s:sub(pos), n + 1
          if held ~= "\r" and not (pending == "" and not mid and #held <= 8192
              and held:sub(1, 5) == ("data:"):sub(1, #held)) then
            if pending ~= "" then out[#out + 1], pending, mid = pending, "", true end
            out[#out + 1], held, passing = held, "", true
          end
        else
          local line = held .. s:sub(pos, e)
          held, pos = "", e + 1
          local b = blank(line)
          if pending ~= "" and b then
            pending, mid = "", false
          else
            if pending ~= "" then out[#out + 1], pending, mid = pending, "", true end
            if not mid and usage(line) then
              pending = line
            else
              out[#out + 1], mid = line, not b
            end
          end
        end
      end
      chunk:setBytes(table.concat(out))
    end
  end
end
