"""The report page's inline stylesheet and script, and the Content-Security-Policy that allows only them."""

CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d1d1f;margin:0;background:#fafafa}
header{background:#1f2d3d;color:#fff;padding:10px 28px 8px}
header h1{margin:0 0 4px;font-size:20px}
header p.facts{margin:0;font-size:13px}header .fact{margin-right:18px}header .fact b{color:#9fb3c8;font-weight:normal}
header details{font-size:12px;margin-top:2px}header summary{cursor:pointer;color:#9fb3c8}
header dl{display:grid;grid-template-columns:max-content 1fr;gap:1px 14px;margin:4px 0 0}
header dt{color:#9fb3c8}header dd{margin:0;word-break:break-all}
nav{padding:6px 28px;background:#eef2f6;font-size:13px;position:sticky;top:0;z-index:2;border-bottom:1px solid #dde3ea}
nav a{margin-right:14px;color:#1f4e79;text-decoration:none}
main{padding:2px 28px 40px}
section{background:#fff;border:1px solid #e3e3e3;border-radius:6px;padding:4px 18px 14px;margin:12px 0}
h2{font-size:18px;margin:8px 0}h3{font-size:15px;margin:12px 0 4px;color:#333}h4{font-size:13px;margin:12px 0 4px;color:#333}
.row{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
figure{margin:0;flex:0 1 auto;max-width:100%}
figcaption,p.caption{font-size:12px;color:#444;max-width:760px;margin:4px 0}
p.caption{max-width:none}
figure.hm{max-width:max(300px,34%)}figure.hm figcaption{max-width:300px}
svg.plot{max-width:100%;height:auto;background:#fff}
.tablebox{flex:1 1 420px;max-height:560px;overflow:auto;border:1px solid #eee;min-width:0;max-width:min(100%,900px)}
.tablebox.wide{flex:1 1 100%;max-height:420px;max-width:100%}
details.more{margin:8px 0}details.more>summary{cursor:pointer;color:#1f4e79;font-size:13px}
.tablebox table+table,.tablebox p+table{margin-top:12px}
table{border-collapse:collapse;font-size:12px;width:100%}
th,td{padding:2px 7px;border-bottom:1px solid #eee;white-space:nowrap}
th{background:#f3f5f7;position:sticky;top:0;cursor:pointer;text-align:left;user-select:none}
th.n,td.n{text-align:right;font-variant-numeric:tabular-nums}
th[aria-sort=ascending]::after{content:" ▲"}th[aria-sort=descending]::after{content:" ▼"}
td.pass{color:#0a6b2d;font-weight:600}td.fail{color:#b00020;font-weight:600}
.ci .v{font-variant-numeric:tabular-nums;white-space:nowrap}
b.flag{color:#a33b00;background:#fff0e0;border-radius:3px;padding:0 3px;font-size:11px;white-space:nowrap}
span.role{color:#5a4a00;background:#fff7d6;border-radius:3px;padding:0 3px;font-size:11px;white-space:nowrap}
p.note{color:#7a5a00;background:#fff8e1;border-left:3px solid #f0b400;padding:6px 10px;margin:8px 0}
p.shown{font-size:11px;color:#666;margin:4px 6px}
#verdict{border:2px solid #1f2d3d}
.verdict-grid{display:flex;gap:18px;align-items:flex-start}
.vlines{flex:1 1 760px;min-width:0}
.vside{flex:0 0 500px;min-width:0}
figure.thumb{margin:0}
.cedges{max-height:300px;overflow:auto;border:1px solid #eee;font-size:12.5px}
.cedges code{font-size:12px}
table.verdicts{font-size:13.5px;width:100%}
table.verdicts th,table.verdicts td{white-space:normal;vertical-align:top;padding:4px 8px;border-bottom:1px solid #eee}
table.verdicts th{position:static;cursor:default;background:none;color:#555;font-weight:600;width:92px}
table.verdicts td.vd{font-weight:700;width:178px}
table.verdicts code{font-size:12.5px;background:#f3f5f7;padding:0 2px}
table.verdicts td.vt{line-height:1.4}
tr.tone-good td.vd{color:#0a6b2d}tr.tone-bad td.vd{color:#b00020}tr.tone-unsure td.vd{color:#8a5a00}
tr.tone-info td.vd{color:#1f4e79}
a.more{font-size:12px;color:#1f4e79;text-decoration:none;white-space:nowrap}
p.notrun{font-size:12.5px;color:#333;margin:8px 0 2px}p.notrun code{font-size:11.5px;background:#f3f5f7;padding:0 3px}
ul.rules{font-size:11.5px;color:#555;margin:4px 0 0;padding-left:18px}
footer{color:#777;font-size:12px;padding:0 28px 24px}
"""

# Sorting: click a header; numbers sort by their exact value (data-v), text alphabetically, blanks last.
JS = """
(function(){
  function key(td){var v=td.getAttribute('data-v');if(v!==null){return v===''?null:parseFloat(v);}return td.textContent;}
  var tables=document.querySelectorAll('table.sortable');
  for(var t=0;t<tables.length;t++){(function(table){
    var ths=table.tHead?table.tHead.rows[0].cells:[];
    for(var i=0;i<ths.length;i++){(function(th,col){
      th.addEventListener('click',function(){
        var asc=th.getAttribute('aria-sort')!=='ascending';
        for(var j=0;j<ths.length;j++){ths[j].removeAttribute('aria-sort');}
        th.setAttribute('aria-sort',asc?'ascending':'descending');
        var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(a,b){
          var x=key(a.cells[col]),y=key(b.cells[col]);
          if(x===null||y===null){return x===y?0:(x===null?1:-1);}
          var c=(typeof x==='number'&&typeof y==='number')?x-y:String(x).localeCompare(String(y));
          return asc?c:-c;});
        for(var r=0;r<rows.length;r++){body.appendChild(rows[r]);}
      });
    })(ths[i],i);}
  })(tables[t]);}
  document.documentElement.setAttribute('data-report-js','ok');
})();
"""

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
